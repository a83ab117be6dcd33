"""`rcpipe serve`: the answer service on Ray Serve and its web page.

    app.py          the HTTP API (POST /answer, GET /models, GET /health) and GET / (page.html)
                    over an ``ask`` coroutine: the limits, and a 4xx with JSON for every
                    malformed request
    deployments.py  the Ray Serve application: a Reader deployment per model, batching
                    what queued while its model computed, and the Ingress holding app.py's
                    FastAPI app
    server.py       the address checked before the models load

The loopback load generator is bench/loadgen.py.
"""
