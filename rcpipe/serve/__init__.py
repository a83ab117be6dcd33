"""`rcpipe serve`: the answer service (FastAPI) and its web page.

    batcher.py   collects concurrent requests into one forward pass (asyncio queue, one
                 model thread)
    app.py       the HTTP API (POST /answer, GET /models, GET /health) and GET / (page.html)
    server.py    uvicorn on a host and port, or in a background thread on a free loopback
                 port (tests, bench/serve.py)
    load.py      a loopback load generator: N concurrent requests, latency percentiles
"""
