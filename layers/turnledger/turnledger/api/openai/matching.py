"""Which stored conversation a request without ``conversation``/``previous_response_id``
continues: the one whose transcript, up to its latest response, the request's leading items
repeat in canonical form (:data:`.items.Canon`), whatever their ids.

The canonical items of a transcript are chained: ``h_0 = ""``, ``h_i = sha256(h_{i-1} "\\n"
canonical JSON of item i)`` (hex). After each stored response, :func:`record` writes two
side items, both expiring with the conversation:

* in the conversation's partition, its *chain*: the hash at its last event, how many
  events that covers, whether they end with an answer of this service's model, and the
  client's calls still without output. It reads only the events after the ones the chain
  already covers, so the cost follows what the request added, not the history;
* when the transcript ends with such an answer, in the tenant's partition
  (:func:`~turnledger.store.keys.tenant_items`), an *index item* under that hash naming the
  conversation and its turn. The chain names it as its companion, so clearing the
  conversation deletes it, and the previous response's index item is deleted: only the
  latest response of a conversation can be continued.

A new fork has no chain of its own (none is copied from its parent), so the first response of a
fork made by ``previous_response_id`` (:func:`.responses.continued_from`) reads its inherited
events once to hash them; later ones read what they add, as above.

:func:`continued` hashes the request's items once, and at each place a response could end
(after the model's items, an assistant message or a run of function calls, where a
non-model item or the end follows; and before a decision) looks the hash up, longest
first, one read each, at most :data:`MAX_LOOKUPS`. A hit continues its conversation when
the conversation is live and its chain is still that hash over all its events: the hit is
its latest response and nothing was added after it. A history that repeats an earlier
response is not found (only the latest is indexed) and never forks: it starts a new
conversation holding the history as the client's, as any unmatched history does; forking
from an earlier response is what ``previous_response_id`` does.

A response that showed no item (a turn that waits for approval or a person's input, on the
Chat Completions face an error) is indexed under the hash of the request's own items: a
request whose whole history hashes to it is that request again. :func:`repeated` answers
it with its turn as it stands (still waiting, or continued since by a decision), so
sending it again runs nothing twice.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from ...core.exceptions import ConversationNotFound, TurnledgerError
from ...core.models import ConversationKey, ConversationStatus, Event
from ...core.observability import logger
from ...store import keys
from ...store.codec import SideItem
from ..resolver import Caller
from .items import Canon, InputItem, transcript

if TYPE_CHECKING:
    from ...turn.pipeline import Conversations
    from ...turn.reads import Reads
    from ...turn.results import TurnResult

__all__ = ["MAX_LOOKUPS", "all_events", "continued", "link", "record", "repeated"]

#: Index reads a request may make (its longest candidate prefixes first).
MAX_LOOKUPS = 8
#: The conversation's chain (its own partition).
CHAIN_SK = f"{keys.SIDE_PREFIX}oai#chain"
#: Index items in the tenant's partition: this prefix and the chain hash.
INDEX_PREFIX = f"{keys.SIDE_PREFIX}oai#t#"
#: Canonical kinds the model gives: a response ends after a run of them.
_MODEL_KINDS = frozenset({"assistant", "function_call"})


def all_events(service: Reads, key: ConversationKey, *, after: int = 0) -> list[Event]:
    """Every event of ``key`` after the public sequence ``after``, oldest first.

    Raises:
        ConversationNotFound: no live conversation.
    """
    events: list[Event] = []
    cursor = after
    while True:
        page = service.events(key, after=cursor, limit=1000)
        events.extend(page.events)
        if page.next_after is None:
            return events
        cursor = page.next_after


def link(previous: str, item: Canon) -> str:
    """The chain hash after ``item``, ``previous`` being the hash before it."""
    text = json.dumps(list(item), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(f"{previous}\n{text}".encode()).hexdigest()


def record(service: Conversations, key: ConversationKey) -> None:
    """Bring ``key``'s chain up to its last event and, when the transcript ends with an
    answer of this service's model, index it. Best effort: a failure leaves the previous
    chain, which a later request finds stale (it then starts a new conversation)."""
    try:
        _record(service, key)
    except TurnledgerError as exc:
        logger.warning("transcript chain not recorded", extra={"error": exc.code})


def _record(service: Conversations, key: ConversationKey) -> None:
    store = service.store
    head = store.get_head(key)
    if head is None or head.status is ConversationStatus.CLEARED:
        return
    saved = store.get_side_item(key, CHAIN_SK)
    start, covered, answered, open_calls = "", 0, False, frozenset[str]()
    if saved is not None and saved.gen == head.gen:
        start = str(saved.attributes["h"])
        covered = int(saved.attributes["n"])
        answered = bool(int(saved.attributes["a"]))
        open_calls = frozenset(json.loads(str(saved.attributes["o"])))
    if covered >= head.event_count:
        return
    events = all_events(service, key, after=covered)
    if not events:
        return
    read = transcript(events, answered=answered, open_calls=open_calls)
    chain = start
    for item in read.items:
        chain = link(chain, item)
    attributes = {
        "h": chain,
        "n": events[-1].sequence,
        "a": int(read.answered),
        "o": json.dumps(sorted(read.open_calls)),
    }
    tenant = keys.tenant_items(key.tenant)
    indexed = f"{INDEX_PREFIX}{chain}" if read.answered else None
    if indexed is not None:
        index = {"c": key.conversation_id, "t": events[-1].turn}
        store.put_side_item(tenant, SideItem(indexed, index, expires_at=head.expires_at))
    # The chain names its index item: clearing the conversation deletes both.
    store.put_side_item(
        key,
        SideItem(CHAIN_SK, attributes, expires_at=head.expires_at, gen=head.gen, companion=indexed),
    )
    previous = saved.companion if saved is not None else None
    if previous is not None and previous != indexed:
        # Only the latest response can be continued; another conversation with the same
        # transcript may have taken the key since.
        stale = store.get_side_item(tenant, previous)
        if stale is not None and stale.attributes.get("c") == key.conversation_id:
            store.delete_side_items(tenant, [previous])


def _ends(items: list[InputItem]) -> list[tuple[int, str]]:
    """``(index in items, chain hash)`` after each run of model items, and before the
    first decision (a response that asks only for approvals shows no item), in order."""
    canon = [(index, item.canon) for index, item in enumerate(items) if item.canon is not None]
    decision = next((i for i, item in enumerate(items) if item.kind == "approval"), len(items))
    ends: list[tuple[int, str]] = []
    chain = ""
    for position, (index, item) in enumerate(canon):
        chain = link(chain, item)
        after = canon[position + 1] if position + 1 < len(canon) else None
        model_run_ends = item[0] in _MODEL_KINDS and (
            after is None or after[1][0] not in _MODEL_KINDS
        )
        # Only where a decision follows: a response never ends with the client's own item.
        before_decision = (
            decision < len(items) and index < decision and (after is None or after[0] > decision)
        )
        if model_run_ends or before_decision:
            ends.append((index, chain))
    return ends


def continued(
    service: Conversations, who: Caller, items: list[InputItem]
) -> tuple[ConversationKey, list[InputItem]] | None:
    """The caller's conversation whose transcript, up to its latest response, the leading
    ``items`` repeat, and the items after it; ``None``: no such conversation."""
    store = service.store
    index_key = keys.tenant_items(who.tenant)
    for end, chain in list(reversed(_ends(items)))[:MAX_LOOKUPS]:
        hit = store.get_side_item(index_key, f"{INDEX_PREFIX}{chain}")
        if hit is None:
            continue
        key = who.key(str(hit.attributes["c"]))
        try:
            events = service.get(key).events
        except ConversationNotFound:
            continue
        saved = store.get_side_item(key, CHAIN_SK)
        if (
            saved is not None
            and saved.attributes.get("h") == chain
            and int(saved.attributes["n"]) == events
        ):
            return key, items[end + 1 :]
    return None


def repeated(service: Conversations, who: Caller, items: list[InputItem]) -> TurnResult | None:
    """The turn whose request ``items`` repeat whole, when that turn showed no item (it
    waited for someone) and is still its conversation's latest: the turn as it stands
    now (its waits, or the answer a decision continued it to; the conversation's chain is
    then brought up to that answer). ``None``: ``items`` are no such request."""
    from ...turn.turn_reads import read_any_turn  # the Chat Completions face's only

    canon = [item.canon for item in items if item.canon is not None]
    if not canon or canon[-1][0] in _MODEL_KINDS:
        return None
    chain = ""
    for item in canon:
        chain = link(chain, item)
    hit = service.store.get_side_item(keys.tenant_items(who.tenant), f"{INDEX_PREFIX}{chain}")
    if hit is None:
        return None
    key = who.key(str(hit.attributes["c"]))
    turn = int(hit.attributes["t"])
    saved = service.store.get_side_item(key, CHAIN_SK)
    try:
        if saved is None or saved.attributes.get("h") != chain or service.get(key).turns != turn:
            return None
        logged = read_any_turn(service, key, turn).logged
    except ConversationNotFound:
        return None
    if logged is None or logged.answer is None:
        return None
    record(service, key)
    return logged.answer
