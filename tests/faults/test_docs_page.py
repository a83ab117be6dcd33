"""Issue 56: the service's /docs loaded Swagger UI from a public CDN (a page that breaks
offline and pulls third-party script into the answer service). /docs and /redoc are off;
/openapi.json, what they rendered, stays; the page at / loads nothing from elsewhere."""

from __future__ import annotations

import re
from typing import Any

from fastapi.testclient import TestClient

from rcpipe.serve.app import create_app


def _ask(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("no question is asked here")


def test_no_page_of_the_service_loads_script_from_elsewhere() -> None:
    client = TestClient(create_app(_ask, ["bidaf"]))
    assert client.get("/docs").status_code == 404
    assert client.get("/redoc").status_code == 404
    assert client.get("/openapi.json").json()["info"]["title"] == "rcpipe answer service"
    page = client.get("/").text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "an outside load"
