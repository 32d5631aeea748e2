"""``GET /v1/agent/wheels/{name}``: the burst wheels cloud nodes install, served by the controller.

With ``BURST_NODE_WHEEL_DIR`` set, a node's cloud-config installs burst from
``{controller_url}/v1/agent/wheels/burst-VERSION-py3-none-any.whl`` (see
:class:`~orchestrator.fabric.bootstrap.NodeInstall`), so nodes need no package index. No token: a
node fetches it before it has joined, and a wheel holds nothing secret. Only ``*.whl`` files
directly in the directory are served; any other name is 404.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import APIRouter
from fastapi import Path as PathParam
from fastapi.responses import FileResponse

from orchestrator.api.problems import Problem

# A wheel file name (PEP 427), and nothing that could leave the directory.
_WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.+-]+\.whl$")
WHEEL_MEDIA_TYPE = "application/zip"


def router(wheel_dir: Path | None) -> APIRouter:
    api = APIRouter()

    @api.get("/v1/agent/wheels/{name}", tags=["agents"], response_class=FileResponse,
             responses={200: {"content": {WHEEL_MEDIA_TYPE: {}}}, 404: {"description": "no such wheel"}})
    def wheel(name: str = PathParam(description="The wheel's file name.", max_length=255,
                                    pattern=_WHEEL_NAME.pattern)) -> FileResponse:
        """A wheel of BURST_NODE_WHEEL_DIR, for a cloud node's install step (no token)."""
        if wheel_dir is None:
            raise Problem(404, "no wheels served", "this controller serves no wheels "
                          "(BURST_NODE_WHEEL_DIR is unset)")
        path = wheel_dir / name
        if not _WHEEL_NAME.match(name) or name.startswith(".") or not path.is_file():
            raise Problem(404, "no such wheel", f"{name!r} is not a wheel this controller serves")
        return FileResponse(path, media_type=WHEEL_MEDIA_TYPE, filename=name)

    return api
