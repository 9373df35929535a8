"""The OpenAI-compatible face: the part of OpenAI's Responses and Conversations API that the
official ``openai`` SDK and the OpenAI Agents SDK use, and Chat Completions for the clients
that speak it, mapped onto the same ledger and tenancy.

``OpenAI(base_url="<api>/openai/v1", api_key=<token>)``: the API key is the bearer token
(locally ``local:<tenant>:<user>``), so the tenant is the caller's as on ``/v1``.

* :mod:`.responses`: ``POST /openai/v1/responses`` (turns, decisions, history, client
  tools, ``store``), streamed by :mod:`.streaming`;
* :mod:`.chat`: ``POST /openai/v1/chat/completions`` (Chat Completions, answered by
  :mod:`.responses`' code on the same chains), its body in :mod:`.chat_schemas` and its
  chunks in :mod:`.chat_streaming`;
* :mod:`.conversations`: the Conversations API and its items;
* :mod:`.items`: item ids, the items events show as, input items, canonical transcripts;
* :mod:`.matching`: which stored conversation a stateless history continues (by content);
* :mod:`.schemas`: request bodies and shared helpers.

Errors under this prefix use OpenAI's shape (``{"error": {"message", "type", "param",
"code"}}``, :func:`turnledger.api.errors.openai_error_body`); ``code`` is the ledger's
error code. Importing :mod:`.conversations` or :mod:`.responses` registers its routes on
the API's resolver; importing this package alone registers none (the read and clear
functions load the Conversations API without the turns of :mod:`.responses`).
"""
