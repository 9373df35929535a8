"""The approval page (``GET /approvals``) in a real browser, against the local runner.

Playwright drives Debian's Chromium (launched by path; ``make test`` installs
it): sign in with a pasted token, see the pending calls, approve one, reject one
with a reason, edit the arguments of a third and approve them, using the mouse
and the keyboard; then the JSON API must show each decision recorded (with the
approver and the hashes) and each turn continued. A tool argument holding HTML
is shown as text and never runs. A human-input call is answered from the page
(an "Answer" box and "Send answer", no approve/reject/edit), and the JSON API
must show ``tool_input_provided`` recorded and the turn continued. The page's
screenshot, a queue holding both kinds with the input call open, is what
``docs/approvals.png`` shows (docs/GUIDE.md): ``TURNLEDGER_SCREENSHOT=docs/approvals.png``
refreshes it; otherwise the test writes its screenshot to a temporary folder, so a
test run never changes the repository.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from turnledger.tools import arguments_sha256
from turnledger_local.runner import LocalConfig, LocalRunner

from tests.http.conftest import with_ask_operator

pytestmark = pytest.mark.http

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "events" / "local-tools.json"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ANN = {"Authorization": "Bearer local:acme:ann"}
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'

sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
if not Path(CHROMIUM).exists():  # pragma: no cover - make test installs it
    pytest.skip("chromium is not installed (make test installs it)", allow_module_level=True)


@pytest.fixture
def runner(runner_config: LocalConfig) -> Iterator[LocalRunner]:
    with LocalRunner(dataclasses.replace(runner_config, tools_file=TOOLS)) as served:
        yield served


@pytest.fixture
def api(runner: LocalRunner) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=runner.url, headers=ANN, timeout=30) as client:
        yield client


def ask(api: httpx.Client, conversation: str, tool: str, arguments: dict[str, Any]) -> str:
    """A turn in ``conversation`` whose model asks for ``tool``; returns the call id."""
    answer = api.post(
        f"/v1/conversations/{conversation}/turns",
        json={"input": f"/tool {tool} {json.dumps(arguments)}"},
    )
    assert answer.json()["status"] == "awaiting_approval", answer.text
    [call] = answer.json()["pending_tool_calls"]
    return str(call["id"])


@contextmanager
def signed_in(runner: LocalRunner) -> Iterator[Any]:
    """The approval page in Chromium, signed in as rita of acme with the keyboard (the token
    field has the focus). On a normal exit, no script of the hostile text ran and the page
    raised no error."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 760})
            failures: list[str] = []
            page.on("pageerror", lambda error: failures.append(str(error)))
            page.goto(f"{runner.url}/approvals")
            page.keyboard.type("local:acme:rita")
            page.keyboard.press("Enter")
            yield page
            assert page.evaluate("window.__pwned") is None
            assert failures == []
        finally:
            browser.close()


def events(api: httpx.Client, conversation: str) -> list[dict[str, Any]]:
    page = api.get(f"/v1/conversations/{conversation}/events", params={"limit": 100})
    return list(page.json()["events"])


def test_deciding_from_the_page(runner: LocalRunner, api: httpx.Client) -> None:
    email = {"to": "bob@example.com", "subject": HOSTILE}
    ask(api, "orders-1", "send_email", email)
    ask(api, "orders-2", "delete_record", {"id": "r-7", "environment": "production"})
    ask(api, "orders-3", "send_email", {"to": "mallory@example.com"})
    other = httpx.post(
        f"{runner.url}/v1/conversations/elsewhere/turns",
        json={"input": '/tool send_email {"to": "x@globex.example"}'},
        headers={"Authorization": "Bearer local:globex:gus"},
    )
    assert other.json()["status"] == "awaiting_approval"

    with signed_in(runner) as page:
        queue = page.locator("#queue button")
        sync_api.expect(queue).to_have_count(3)
        sync_api.expect(page.locator("#count")).to_have_text("(3)")
        assert "globex" not in page.locator("#queue").inner_text()

        # 1. Open the oldest with the keyboard; its HTML argument is shown as text.
        page.keyboard.press("Escape")
        page.keyboard.press("j")
        page.keyboard.press("Enter")
        sync_api.expect(page.locator("#call-tool")).to_have_text("send_email")
        sync_api.expect(page.locator("#call-conversation")).to_have_text("orders-1")
        assert json.loads(page.locator("#arguments").inner_text()) == email
        sync_api.expect(page.locator("#messages")).to_contain_text("ann")
        assert page.locator("#arguments img, #arguments script").count() == 0
        assert page.evaluate("window.__pwned") is None
        page.keyboard.press("a")  # approve
        sync_api.expect(page.locator("#notice")).to_contain_text("Approved send_email")
        sync_api.expect(queue).to_have_count(2)

        # 2. Reject the delete with a reason (mouse).
        queue.filter(has_text="delete_record").click()
        page.locator("#reject-reason").fill("wrong record")
        page.locator("#reject").click()
        sync_api.expect(page.locator("#notice")).to_contain_text("Rejected delete_record")
        sync_api.expect(queue).to_have_count(1)

        # 3. Edit the last one's arguments, then approve them; bad JSON is refused first.
        queue.first.click()
        page.locator("#edit").click()
        page.locator("#edit-arguments").fill("{not json")
        page.locator("#edit-approve").click()
        sync_api.expect(page.locator("#error")).to_contain_text("not valid JSON")
        page.locator("#edit-arguments").fill('{"to": 5}')
        page.locator("#edit-approve").click()
        sync_api.expect(page.locator("#error")).to_contain_text("refused as invalid")
        page.locator("#edit-arguments").fill('{"to": "carol@example.com"}')
        page.locator("#edit-approve").click()
        sync_api.expect(page.locator("#notice")).to_contain_text("Approved (edited)")
        sync_api.expect(queue).to_have_count(0)
        sync_api.expect(page.locator("#empty")).to_be_visible()

    # Every decision recorded, by the page's user, and every turn continued.
    for conversation in ("orders-1", "orders-2", "orders-3"):
        assert api.get(f"/v1/conversations/{conversation}").json()["status"] == "complete"
    [approved] = [e for e in events(api, "orders-1") if e["kind"] == "approval_resolved"]
    assert approved["payload"]["decision"] == "approved"
    assert approved["payload"]["approver"] == "rita"
    assert approved["payload"]["arguments_sha256"] == arguments_sha256(email)
    [rejected] = [e for e in events(api, "orders-2") if e["kind"] == "approval_resolved"]
    assert (rejected["payload"]["decision"], rejected["payload"]["reason"]) == (
        "rejected",
        "wrong record",
    )
    [result] = [e for e in events(api, "orders-2") if e["kind"] == "tool_result"]
    assert result["payload"]["is_error"] and "wrong record" in result["payload"]["output"]
    [edited] = [e for e in events(api, "orders-3") if e["kind"] == "approval_resolved"]
    assert edited["payload"]["approved_arguments"] == {"to": "carol@example.com"}
    assert edited["payload"]["approved_arguments_sha256"] == arguments_sha256(
        {"to": "carol@example.com"}
    )
    [ran] = [e for e in events(api, "orders-3") if e["kind"] == "tool_result"]
    assert "carol@example.com" in ran["payload"]["output"]
    assert "mallory" not in ran["payload"]["output"]
    assert api.get("/v1/approvals").json()["items"] == []
    globex = httpx.get(
        f"{runner.url}/v1/approvals", headers={"Authorization": "Bearer local:globex:gus"}
    )
    assert [i["conversation_id"] for i in globex.json()["items"]] == ["elsewhere"]


def test_the_page_is_served_with_a_strict_policy(runner: LocalRunner) -> None:
    answer = httpx.get(f"{runner.url}/approvals")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    policy = answer.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "http" not in policy.replace("'self'", "")
    assert "innerHTML" not in answer.text and "insertAdjacentHTML" not in answer.text


@pytest.fixture
def human_runner(runner_config: LocalConfig, tmp_path: Path) -> Iterator[LocalRunner]:
    tools = with_ask_operator(tmp_path)
    with LocalRunner(dataclasses.replace(runner_config, tools_file=tools)) as served:
        yield served


def test_answering_an_input_call_from_the_page(human_runner: LocalRunner, tmp_path: Path) -> None:
    runner = human_runner
    with httpx.Client(base_url=runner.url, headers=ANN, timeout=30) as api:
        ask(api, "orders-1", "send_email", {"to": "bob@example.com", "subject": HOSTILE})
        asked = api.post(
            "/v1/conversations/budget-1/turns",
            json={"input": '/tool ask_operator {"question": "Budget for <b>Q1</b>?"}'},
        )
        assert asked.json()["status"] == "awaiting_hitl", asked.text
        [call] = asked.json()["pending_tool_calls"]

        with signed_in(runner) as page:
            queue = page.locator("#queue button")
            sync_api.expect(queue).to_have_count(2)
            sync_api.expect(queue.nth(1).locator(".kind")).to_have_text("input")

            # Open the input call with the keyboard: no approve, reject or edit for it.
            page.keyboard.press("Escape")
            page.keyboard.press("j")
            page.keyboard.press("j")
            page.keyboard.press("Enter")
            sync_api.expect(page.locator("#call-tool")).to_have_text("ask_operator")
            sync_api.expect(page.locator("#call-kind")).to_have_text("input")
            assert json.loads(page.locator("#arguments").inner_text()) == {
                "question": "Budget for <b>Q1</b>?"
            }
            assert page.locator("#arguments b").count() == 0  # shown as text
            for hidden in ("#approve", "#reject", "#edit", "#reject-reason"):
                sync_api.expect(page.locator(hidden)).to_be_hidden()
            answer = page.get_by_label("Answer", exact=True)
            sync_api.expect(answer).to_be_visible()
            sync_api.expect(page.get_by_role("button", name="Send answer")).to_be_visible()
            page.keyboard.press("a")  # approval keys do nothing here
            assert api.get("/v1/conversations/orders-1").json()["status"] == "awaiting_approval"

            # A blank answer is refused in words; nothing is sent.
            page.keyboard.press("i")
            sync_api.expect(answer).to_be_focused()
            page.keyboard.press("Control+Enter")
            sync_api.expect(page.locator("#error")).to_contain_text("Type an answer first")
            assert api.get("/v1/conversations/budget-1").json()["status"] == "awaiting_hitl"

            # Several lines (Enter is a new line), then Ctrl+Enter sends.
            page.keyboard.type("42k for Q1")
            sync_api.expect(page.locator("#error")).to_be_empty()
            page.keyboard.press("Enter")
            page.keyboard.type("<i>approved by finance</i>")
            sync_api.expect(page.locator("#messages")).to_contain_text("ann")
            target = Path(os.environ.get("TURNLEDGER_SCREENSHOT") or tmp_path / "page.png")
            page.screenshot(path=str(target))
            assert target.stat().st_size > 10_000  # a rendered page, not an empty image
            page.keyboard.press("Control+Enter")
            sync_api.expect(page.locator("#notice")).to_contain_text(
                "Answered ask_operator in budget-1"
            )
            sync_api.expect(page.locator("#notice")).to_contain_text("now complete")
            sync_api.expect(queue).to_have_count(1)
            sync_api.expect(queue.first.locator(".kind")).to_have_text("approval")

            # Answered elsewhere meanwhile: the page says so in words.
            second = api.post(
                "/v1/conversations/budget-2/turns",
                json={"input": '/tool ask_operator {"question": "Deadline?"}'},
            )
            [late] = second.json()["pending_tool_calls"]
            page.locator("#refresh").click()
            sync_api.expect(queue).to_have_count(2)
            queue.filter(has_text="budget-2").click()
            answered = api.post(
                "/v1/conversations/budget-2/approvals",
                json={"outputs": [{"id": late["id"], "output": "Friday"}]},
            )
            assert answered.status_code == 200, answered.text
            page.get_by_label("Answer", exact=True).fill("Monday")
            page.get_by_role("button", name="Send answer").click()
            sync_api.expect(page.locator("#error")).to_contain_text(
                "no longer waiting: someone else decided or answered it"
            )
            sync_api.expect(queue).to_have_count(1)

        # Recorded through the API: who answered, how, what the model saw.
        budget = api.get("/v1/conversations/budget-1").json()
        assert budget["status"] == "complete"
        kinds = [e["kind"] for e in events(api, "budget-1")]
        assert kinds.index("tool_input_provided") < kinds.index("tool_result")
        [provided] = [e for e in events(api, "budget-1") if e["kind"] == "tool_input_provided"]
        assert provided["actor"] == "rita"
        assert provided["payload"] == {
            "call_id": call["id"],
            "name": "ask_operator",
            "provided_by": "rita",
            "via": "approvals",
        }
        [result] = [e for e in events(api, "budget-1") if e["kind"] == "tool_result"]
        assert result["payload"]["output"] == "42k for Q1\n<i>approved by finance</i>"
        [reply] = [e for e in events(api, "budget-1") if e["kind"] == "assistant_message"][-1:]
        assert "42k for Q1" in reply["payload"]["content"]
        [kept] = [e for e in events(api, "budget-2") if e["kind"] == "tool_result"]
        assert kept["payload"]["output"] == "Friday"  # the page's late answer stored nothing
        assert [i["kind"] for i in api.get("/v1/approvals").json()["items"]] == ["approval"]
