"""DynamoDB driver (`dynamodb://table?endpoint_url=http://…&region=us-east-1`).

Partition key and key become the table's binary hash and range keys, so a partition is one
item collection read in key order by `Query`. Writes are conditional `PutItem`s; reads are
strongly consistent for read-after-write. Endpoint and region fall back to the usual AWS
environment variables; the table is created on first use (on-demand billing), unless the
store is opened with `create=False`.

A conditional write (`set_if`, `delete_if`) is never sent twice after its reply was lost (a
read timeout, a reset connection, a 5xx): DynamoDB may have applied it, and the repeat would
find its own write and fail its condition, a false `PredicateFailed` for a write that landed.
botocore's retries would send it again, so those writes go through a client that sends each
request once, and only a refusal that applied nothing (throttling, no connection made) is
tried again here; a lost reply raises `OutcomeUnknown`: the write may have been applied.
A guarded step's transaction carries an idempotency token, so botocore's retries of it are
safe: DynamoDB answers a repeat with the first one's outcome.
"""

from __future__ import annotations

import random
import re
import time
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
)

from branchwater.engine.errors import (
    BranchwaterError,
    ConfigurationError,
    InvalidArgument,
    LakeNotFound,
    OutcomeUnknown,
    PredicateFailed,
    Unavailable,
    lake_closed,
)
from branchwater.engine.kv.store import UNKNOWN_OUTCOME, Store, key_not_found
from branchwater.engine.per_process import PerProcess
from branchwater.engine.urls import redact_url, scrub, url_password, url_secrets

PARTITION_ATTR = "PartitionKey"
KEY_ATTR = "ItemKey"
VALUE_ATTR = "ItemValue"
CONNECT_TIMEOUT_SECONDS = 5
READ_TIMEOUT_SECONDS = 30
MAX_ATTEMPTS = 3
"""botocore's retries of a request (after the first try) that may be sent again."""
WRITE_TRIES = MAX_ATTEMPTS + 1
"""Tries of a conditional write that DynamoDB refused having applied nothing (throttled)."""
WRITE_PAUSE_SECONDS = 0.05
"""The longest first pause before trying a refused conditional write again, doubled each
time."""
TABLE_WAIT_SECONDS = 300
TRANSACTION_TRIES = 5
"""Tries of a guarded step's transaction that DynamoDB cancelled for meeting another request
on one of its items (`TransactionConflict`): nothing of it was written."""
TRANSACTION_PAUSE_SECONDS = 0.02
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")

_KEY_SCHEMA = [
    {"AttributeName": PARTITION_ATTR, "KeyType": "HASH"},
    {"AttributeName": KEY_ATTR, "KeyType": "RANGE"},
]
_ATTRIBUTES = [
    {"AttributeName": PARTITION_ATTR, "AttributeType": "B"},
    {"AttributeName": KEY_ATTR, "AttributeType": "B"},
]
_MUST_NOT_EXIST = f"attribute_not_exists({KEY_ATTR})"
_MUST_EXIST = f"attribute_exists({KEY_ATTR})"
_MUST_EQUAL = f"{VALUE_ATTR} = :expected"
_ABSENT_OR_EMPTY = f"{_MUST_NOT_EXIST} OR size({VALUE_ATTR}) = :empty"
_THROTTLED = frozenset(
    ("ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded")
)
"""Refusals of a request that applied nothing, worth trying again after a pause."""
_CANCELLED_UNAPPLIED = frozenset(
    ("TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded")
)
"""Reasons DynamoDB cancels a transaction for, having written nothing, that may pass."""
_NOT_SENT = (EndpointConnectionError, ConnectTimeoutError)
"""Failures to connect: the request never reached DynamoDB."""


class DynamoDBStore(Store):
    """A `Store` in one DynamoDB table; its boto3 clients (one retrying, one sending each
    conditional write once) are shared by all threads of a process, and a forked child
    makes its own (`PerProcess`)."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.url = redact_url(url)
        """The store's URL with any secret masked: it ends up in messages and logs."""
        self._secrets = url_secrets(url)
        self.table, endpoint_url, region = _parse(url, self.url)
        self._client_options = {"endpoint_url": endpoint_url, "region_name": region}
        self._clients: PerProcess[Any] = PerProcess(lambda: self._new_client(MAX_ATTEMPTS))
        self._once_clients: PerProcess[Any] = PerProcess(lambda: self._new_client(0))
        self._closed = False
        self._clients.get()
        self._call("ensure table", self._ensure_table, create=create)

    def _new_client(self, retries: int) -> Any:
        """A client whose botocore retries a failed request `retries` times."""
        config = Config(
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            read_timeout=READ_TIMEOUT_SECONDS,
            retries={"mode": "standard", "max_attempts": retries},
        )
        try:
            return boto3.client("dynamodb", config=config, **self._client_options)
        except (BotoCoreError, ValueError) as exc:
            reason = scrub(str(exc), self._secrets)
            raise ConfigurationError(f"cannot configure DynamoDB for {self.url}: {reason}") from exc

    @property
    def _client(self) -> Any:
        """The client for requests that may be sent again (botocore retries them); none once
        closed, as a closed client would open its connections again."""
        if self._closed:
            raise lake_closed()
        return self._clients.get()

    @property
    def _once_client(self) -> Any:
        """The client for conditional writes: each request sent once (`_write_once`)."""
        if self._closed:
            raise lake_closed()
        return self._once_clients.get()

    def _ensure_table(self, create: bool) -> None:
        """Create the table unless it exists; a concurrent creator's win counts as ours.
        Without `create`, a table that does not exist is `LakeNotFound` (one being created
        is waited for, as it is then a lake)."""
        try:
            status = self._client.describe_table(TableName=self.table)["Table"]["TableStatus"]
        except ClientError as exc:
            if _code(exc) != "ResourceNotFoundException":
                raise
            if not create:
                raise LakeNotFound(
                    self.url, f"DynamoDB table {self.table!r} does not exist"
                ) from None
            status = "CREATING"
            try:
                self._client.create_table(
                    TableName=self.table,
                    KeySchema=_KEY_SCHEMA,
                    AttributeDefinitions=_ATTRIBUTES,
                    BillingMode="PAY_PER_REQUEST",
                )
            except ClientError as create_exc:
                if _code(create_exc) != "ResourceInUseException":
                    raise
        if status != "ACTIVE":
            self._client.get_waiter("table_exists").wait(
                TableName=self.table,
                WaiterConfig={"Delay": 1, "MaxAttempts": TABLE_WAIT_SECONDS},
            )

    def _call(self, action: str, fn: Any, /, **kwargs: Any) -> Any:
        """Run one client call, turning AWS failures into the typed errors callers expect."""
        try:
            return fn(**kwargs)
        except ClientError as exc:
            raise self._failure(action, exc) from exc
        except BotoCoreError as exc:
            reason = scrub(str(exc), self._secrets)
            raise Unavailable(
                f"DynamoDB at {self.url} is unavailable ({action}): {reason}"
            ) from exc

    def _failure(self, action: str, exc: ClientError) -> BranchwaterError:
        code = _code(exc)
        message = scrub(exc.response.get("Error", {}).get("Message", str(exc)), self._secrets)
        reasons = _cancellation_reasons(exc)
        if code == "ConditionalCheckFailedException" or "ConditionalCheckFailed" in reasons:
            return PredicateFailed(f"{action}: condition failed in table {self.table!r}")
        if code == "ValidationException" or "ValidationError" in reasons:
            return InvalidArgument(f"DynamoDB rejected {action} in {self.url}: {message}")
        if reasons & _CANCELLED_UNAPPLIED:
            return _Conflicted(
                f"DynamoDB at {self.url} kept cancelling {action} for conflicting requests "
                f"on its items or throttling: try again ({message})"
            )
        return Unavailable(f"DynamoDB at {self.url} is unavailable ({action}): {code} {message}")

    def _write_once(self, action: str, method: str, /, **kwargs: Any) -> None:
        """A conditional write, never sent again once it may have reached DynamoDB (module
        docstring): tried again only after a refusal that applied nothing (throttled, no
        connection made), after a pause that grows each time (with jitter, as botocore's)."""
        for attempt in range(WRITE_TRIES):
            if attempt:
                time.sleep(random.random() * WRITE_PAUSE_SECONDS * 2**attempt)
            try:
                getattr(self._once_client, method)(**kwargs)
                return
            except (ClientError, BotoCoreError) as exc:
                refused = isinstance(exc, _NOT_SENT) or (
                    isinstance(exc, ClientError) and _code(exc) in _THROTTLED
                )
                if not refused or attempt == WRITE_TRIES - 1:
                    raise self._sent_failure(action, exc) from exc

    def _sent_failure(self, action: str, exc: ClientError | BotoCoreError) -> BranchwaterError:
        """The typed error of a write that failed: `_failure`'s for an answer that applied
        nothing; for a reply that never came (a timeout, a reset connection, a 5xx, which
        DynamoDB documents as maybe applied), `OutcomeUnknown`."""
        if isinstance(exc, ClientError) and _status(exc) < 500:
            return self._failure(action, exc)
        if isinstance(exc, _NOT_SENT):
            reason = scrub(str(exc), self._secrets)
            return Unavailable(f"DynamoDB at {self.url} is unavailable ({action}): {reason}")
        if isinstance(exc, ClientError):
            reason = f"{_code(exc)}, HTTP {_status(exc)}"
        else:
            reason = scrub(str(exc), self._secrets)
        return OutcomeUnknown(
            f"DynamoDB at {self.url} did not answer a conditional {action} ({reason}), so it "
            f"{UNKNOWN_OUTCOME}"
        )

    def _item_key(self, partition: bytes, key: bytes) -> dict[str, Any]:
        return {PARTITION_ATTR: {"B": partition}, KEY_ATTR: {"B": key}}

    def _put(self, partition: bytes, key: bytes, value: bytes, **condition: Any) -> None:
        item = self._item_key(partition, key)
        item[VALUE_ATTR] = {"B": value}
        if condition:
            self._write_once("put", "put_item", TableName=self.table, Item=item, **condition)
        else:
            self._call("put", self._client.put_item, TableName=self.table, Item=item)

    def _get(self, partition: bytes, key: bytes) -> bytes:
        response = self._call(
            "get",
            self._client.get_item,
            TableName=self.table,
            Key=self._item_key(partition, key),
            ConsistentRead=True,
        )
        item = response.get("Item")
        if item is None:
            raise key_not_found(partition, key)
        return item[VALUE_ATTR]["B"]

    def _set(self, partition: bytes, key: bytes, value: bytes) -> None:
        self._put(partition, key, value)

    def _create(self, partition: bytes, key: bytes, value: bytes) -> None:
        try:
            self._put(partition, key, value, ConditionExpression=_MUST_NOT_EXIST)
        except PredicateFailed:
            raise PredicateFailed(
                f"key {key!r} already exists in partition {partition!r}"
            ) from None

    def _replace(self, partition: bytes, key: bytes, value: bytes) -> None:
        try:
            self._put(partition, key, value, ConditionExpression=_MUST_EXIST)
        except PredicateFailed:
            raise PredicateFailed(
                f"key {key!r} does not exist in partition {partition!r}"
            ) from None

    def _swap(self, partition: bytes, key: bytes, value: bytes, expected: bytes) -> None:
        try:
            self._put(
                partition,
                key,
                value,
                ConditionExpression=_MUST_EQUAL,
                ExpressionAttributeValues={":expected": {"B": expected}},
            )
        except PredicateFailed:
            raise PredicateFailed(
                f"key {key!r} in partition {partition!r} changed since read"
            ) from None

    def _delete(self, partition: bytes, key: bytes) -> None:
        self._call(
            "delete",
            self._client.delete_item,
            TableName=self.table,
            Key=self._item_key(partition, key),
        )

    def _delete_if(self, partition: bytes, key: bytes, expected: bytes) -> None:
        try:
            self._write_once(
                "delete",
                "delete_item",
                TableName=self.table,
                Key=self._item_key(partition, key),
                ConditionExpression=_MUST_EQUAL,
                ExpressionAttributeValues={":expected": {"B": expected}},
            )
        except PredicateFailed:
            raise PredicateFailed(
                f"key {key!r} in partition {partition!r} changed since read"
            ) from None

    def _guard_check(self, guard: tuple[bytes, bytes], expected: bytes) -> dict[str, Any]:
        """The guarded steps' transaction item: the guard must hold `expected`."""
        return {
            "TableName": self.table,
            "Key": self._item_key(*guard),
            "ConditionExpression": _MUST_EQUAL,
            "ExpressionAttributeValues": {":expected": {"B": expected}},
        }

    def _delete_guarded(
        self, partition: bytes, key: bytes, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool:
        """One transaction: the guard's condition checked and the key deleted together."""
        delete = {"TableName": self.table, "Key": self._item_key(partition, key)}
        items = [{"ConditionCheck": self._guard_check(guard, expected)}, {"Delete": delete}]
        try:
            self._transact("delete", items)
        except PredicateFailed:
            return False
        return True

    def _create_guarded(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        guard: tuple[bytes, bytes],
        expected: bytes,
    ) -> bool:
        """One transaction, as `_delete_guarded`: the guard's condition checked and the key
        put where it is absent or empty. A cancelled one means the guard failed or the key
        holds a value: the guard, read again, says which."""
        item = {**self._item_key(partition, key), VALUE_ATTR: {"B": value}}
        put = {
            "TableName": self.table,
            "Item": item,
            "ConditionExpression": _ABSENT_OR_EMPTY,
            "ExpressionAttributeValues": {":empty": {"N": "0"}},
        }
        items = [{"ConditionCheck": self._guard_check(guard, expected)}, {"Put": put}]
        try:
            self._transact("put", items)
        except PredicateFailed:
            return self._refused_creation(guard, expected)
        return True

    def _transact(self, action: str, items: list[dict[str, Any]]) -> None:
        """Write `items` in one transaction. DynamoDB cancels one that meets a concurrent
        write of the branch record it checks (`TransactionConflict`), or that it throttles,
        having written nothing: that is tried again, not reported as the store unavailable
        or the guard failed (an exclusive creation would then say the path exists). botocore
        sends it again after a lost reply with the same idempotency token; once its retries
        are spent, the outcome is unknown (`_sent_failure`)."""
        for attempt in range(TRANSACTION_TRIES):
            try:
                self._client.transact_write_items(TransactItems=items)
                return
            except (ClientError, BotoCoreError) as exc:
                error = self._sent_failure(action, exc)
                if not isinstance(error, _Conflicted) or attempt == TRANSACTION_TRIES - 1:
                    raise error from exc
            time.sleep(TRANSACTION_PAUSE_SECONDS * 2**attempt)

    def _scan_batch(
        self, partition: bytes, start: bytes, inclusive: bool, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Query pages until `limit` pairs or the partition's end.

        A page can stop early at DynamoDB's 1 MB cap, and a short batch would tell the
        caller the partition has ended, so pages are joined up to the full batch.
        """
        request: dict[str, Any] = {
            "TableName": self.table,
            "ConsistentRead": True,
            "ScanIndexForward": True,
            **_key_condition(partition, start, inclusive),
        }
        pairs: list[tuple[bytes, bytes]] = []
        while len(pairs) < limit:
            response = self._call("scan", self._client.query, Limit=limit - len(pairs), **request)
            pairs.extend((i[KEY_ATTR]["B"], i[VALUE_ATTR]["B"]) for i in response["Items"])
            if "LastEvaluatedKey" not in response:
                break
            request["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return pairs

    def close(self) -> None:
        self._closed = True
        for clients in (self._clients, self._once_clients):
            client = clients.made_here()
            if client is not None:
                client.close()


def _key_condition(partition: bytes, start: bytes, inclusive: bool) -> dict[str, Any]:
    """`pk = :p` plus a range condition on the key.

    DynamoDB refuses an empty binary in a condition, so an empty start is left out: every
    key is at least that, and a continuation always starts after a real, non-empty key.
    """
    values: dict[str, Any] = {":p": {"B": partition}}
    condition = f"{PARTITION_ATTR} = :p"
    if start:
        condition += f" AND {KEY_ATTR} {'>=' if inclusive else '>'} :start"
        values[":start"] = {"B": start}
    return {"KeyConditionExpression": condition, "ExpressionAttributeValues": values}


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


class _Conflicted(Unavailable):
    """A transaction DynamoDB cancelled, having written nothing, for a concurrent request on
    one of its items or for throttling: worth trying again."""


def _cancellation_reasons(exc: ClientError) -> frozenset[str]:
    """Why DynamoDB cancelled a transaction, one code per item (`None` for an item that was
    not the cause); empty for any other error."""
    if _code(exc) != "TransactionCanceledException":
        return frozenset()
    reasons = exc.response.get("CancellationReasons") or []
    return frozenset(str(reason.get("Code")) for reason in reasons)


def _parse(url: str, redacted: str) -> tuple[str, str | None, str | None]:
    """Table name, endpoint URL and region; unset endpoint/region defer to boto3's lookup.

    Credentials come from boto3's chain (environment, profile, role), never from the URL:
    one written into it is refused, so a key pasted there is not used half-parsed."""
    if url_password(url) is not None:
        raise ConfigurationError(
            f"DynamoDB URL {redacted!r} holds credentials; give them through the AWS "
            "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a profile instead"
        )
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigurationError(
            f"malformed DynamoDB URL {redacted!r}: use dynamodb://table?endpoint_url=…&region=…"
        ) from None
    table = parts.netloc or parts.path.lstrip("/")
    if not _TABLE_NAME.fullmatch(table):
        raise ConfigurationError(
            f"DynamoDB URL {redacted!r} needs a table name of 3-255 letters, digits, '_', '-', '.'"
        )
    options = dict(parse_qsl(parts.query))
    endpoint_url = options.pop("endpoint_url", None)
    region = options.pop("region", None)
    if options:
        raise ConfigurationError(
            f"DynamoDB URL {redacted!r}: unknown options {sorted(options)}; "
            "use endpoint_url= and region="
        )
    return table, endpoint_url, region
