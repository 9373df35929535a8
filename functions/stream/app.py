"""Lambda entry point of the streaming function: its URL answers in ``RESPONSE_STREAM`` mode.

A turn with ``Accept: text/event-stream`` and the OpenAI face's ``stream: true`` are
written to the client as the model writes them (:mod:`turnledger.api.live`); any other
request to the URL is answered whole, as the API answers it. Deployed, the Lambda Web
Adapter runs ``run.sh``, whose server (:mod:`turnledger.api.stream_server`) calls this
handler; the local runner's workers call it directly.
"""

from turnledger.core.initphase import init_phase

# The init: no garbage collection while it loads and builds (turnledger.core.initphase).
with init_phase():
    from turnledger.api.functions import serve_streaming
    from turnledger.runtime import prepare

    # This function's routes only (turnledger.api.functions.ROUTES["stream"]).
    lambda_handler = serve_streaming("stream")
    prepare()

__all__ = ["lambda_handler"]
