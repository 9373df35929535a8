#!/bin/sh
# The Lambda Web Adapter runs this script (Handler: run.sh): the handler's HTTP server, to
# which the adapter passes each function URL request and from which it streams each answer.
exec python3 -m turnledger.api.stream_server
