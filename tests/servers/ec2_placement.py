"""EC2 placement groups for the moto test peer: the part of the EC2 API moto does not implement.

moto (5.x) answers CreatePlacementGroup, DescribePlacementGroups and DeletePlacementGroup with
``NotImplementedError`` (HTTP 500), and ignores ``Placement.GroupName`` on RunInstances. This WSGI
middleware sits in front of moto and serves those three actions itself, per the EC2 API reference
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html,
API_DescribePlacementGroups.html, API_DeletePlacementGroup.html): the query-protocol parameters,
the XML replies, and the documented errors:

* ``InvalidPlacementGroup.Duplicate`` (400): a group of that name exists in the region;
* ``InvalidPlacementGroup.Unknown`` (400): no such group (delete, describe by name, or a
  RunInstances naming one);
* ``InvalidPlacementGroup.InUse`` (400): deleting a group that still holds an instance not yet
  terminated (EC2: "You must terminate all instances in the placement group before you can
  delete the placement group").

RunInstances naming a group is checked and passed on to moto; the ids it returns are recorded as
the group's members (``members(name)``), which is what tests inspect. Instance states are read
from moto's in-process backend. Regions come from the request's SigV4 credential scope.
"""

from __future__ import annotations

import io
import re
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/ec2/")
_INSTANCE_ID = re.compile(rb"<instanceId>(i-[0-9a-f]+)</instanceId>")
ACCOUNT = "123456789012"  # moto's default account
STRATEGIES = ("cluster", "spread", "partition")


@dataclass
class _Group:
    name: str
    strategy: str
    region: str
    group_id: str
    tags: dict[str, str] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)


class _Fail(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class PlacementGroupsApp:
    """WSGI middleware serving EC2 placement groups in front of moto (see the module docstring)."""

    def __init__(self, app: Any):
        self.app = app
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str], _Group] = {}  # (region, name) -> group

    def reset(self) -> None:
        with self._lock:
            self._groups.clear()

    def members(self, name: str, region: str = "us-east-1") -> list[str]:
        with self._lock:
            group = self._groups.get((region, name))
            return list(group.members) if group else []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO", "").startswith("/moto-api/reset"):
            self.reset()
            return self.app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        params = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        action = params.get("Action")
        match = _SCOPE.search(environ.get("HTTP_AUTHORIZATION", ""))
        region = match.group(1) if match else "us-east-1"
        handler = {"CreatePlacementGroup": self._create, "DeletePlacementGroup": self._delete,
                   "DescribePlacementGroups": self._describe}.get(action or "")
        try:
            if handler is not None:
                return _reply(start_response, 200, handler(params, region))
            if action == "RunInstances" and params.get("Placement.GroupName"):
                return self._run_instances(environ, start_response, params, region)
        except _Fail as fail:
            return _error(start_response, fail)
        return self.app(environ, start_response)

    # -- actions ------------------------------------------------------------------------------

    def _create(self, params: dict[str, str], region: str) -> str:
        name = params.get("GroupName") or ""
        strategy = params.get("Strategy", "")
        if not name:
            raise _Fail("MissingParameter", "The request must contain the parameter GroupName")
        if strategy not in STRATEGIES:
            raise _Fail("InvalidParameterValue", f"Invalid value '{strategy}' for Strategy")
        tags = _tags(params, "placement-group")
        with self._lock:
            if (region, name) in self._groups:
                raise _Fail("InvalidPlacementGroup.Duplicate",
                            f"The Placement Group '{name}' already exists.")
            group = _Group(name, strategy, region, "pg-" + uuid.uuid4().hex[:17], tags)
            self._groups[(region, name)] = group
            item = _item(group)
        return (f"<CreatePlacementGroupResponse xmlns=\"{_NS}\"><requestId>{uuid.uuid4()}"
                f"</requestId><return>true</return><placementGroup>{item}</placementGroup>"
                "</CreatePlacementGroupResponse>")

    def _delete(self, params: dict[str, str], region: str) -> str:
        name = params.get("GroupName") or ""
        with self._lock:
            group = self._groups.get((region, name))
            if group is None:
                raise _Fail("InvalidPlacementGroup.Unknown",
                            f"The Placement Group '{name}' is unknown.")
            if any(_alive(region, i) for i in group.members):
                raise _Fail("InvalidPlacementGroup.InUse",
                            f"The placement group '{name}' is in use and may not be deleted.")
            del self._groups[(region, name)]
        return (f"<DeletePlacementGroupResponse xmlns=\"{_NS}\"><requestId>{uuid.uuid4()}"
                "</requestId><return>true</return></DeletePlacementGroupResponse>")

    def _describe(self, params: dict[str, str], region: str) -> str:
        names = [v for k, v in params.items() if re.fullmatch(r"GroupName\.\d+", k)]
        filters: dict[str, list[str]] = {}
        for key, value in params.items():
            m = re.fullmatch(r"Filter\.(\d+)\.Name", key)
            if m:
                filters[value] = [v for k, v in params.items()
                                  if re.fullmatch(rf"Filter\.{m.group(1)}\.Value\.\d+", k)]
        with self._lock:
            groups = [g for (r, _), g in self._groups.items() if r == region]
            for name in names:
                if not any(g.name == name for g in groups):
                    raise _Fail("InvalidPlacementGroup.Unknown",
                                f"The Placement Group '{name}' is unknown.")
            chosen = [g for g in groups if (not names or g.name in names)
                      and all(_matches(g, f, values) for f, values in filters.items())]
            items = "".join(f"<item>{_item(g)}</item>" for g in chosen)
        return (f"<DescribePlacementGroupsResponse xmlns=\"{_NS}\"><requestId>{uuid.uuid4()}"
                f"</requestId><placementGroupSet>{items}</placementGroupSet>"
                "</DescribePlacementGroupsResponse>")

    def _run_instances(self, environ: dict[str, Any], start_response: Any,
                       params: dict[str, str], region: str) -> Any:
        name = params["Placement.GroupName"]
        with self._lock:
            if (region, name) not in self._groups:
                raise _Fail("InvalidPlacementGroup.Unknown",
                            f"The Placement Group '{name}' is unknown.")
        status: list[Any] = []

        def capture(s: str, headers: list, exc_info: Any = None) -> Any:
            status.append((s, headers))
            return start_response(s, headers, exc_info) if exc_info else start_response(s, headers)

        chunks = list(self.app(environ, capture))
        if status and status[0][0].startswith("200"):
            ids = [m.decode() for m in _INSTANCE_ID.findall(b"".join(chunks))]
            with self._lock:
                group = self._groups.get((region, name))
                if group is not None:
                    group.members.extend(i for i in ids if i not in group.members)
        return chunks


def _tags(params: dict[str, str], resource: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for key, value in params.items():
        m = re.fullmatch(r"TagSpecification\.(\d+)\.ResourceType", key)
        if m and value == resource:
            n = m.group(1)
            for tag_key, tag_name in params.items():
                t = re.fullmatch(rf"TagSpecification\.{n}\.Tag\.(\d+)\.Key", tag_key)
                if t:
                    tags[tag_name] = params.get(f"TagSpecification.{n}.Tag.{t.group(1)}.Value", "")
    return tags


def _matches(group: _Group, name: str, values: list[str]) -> bool:
    if name == "group-name":
        return group.name in values
    if name == "strategy":
        return group.strategy in values
    if name == "state":
        return "available" in values
    if name.startswith("tag:"):
        return group.tags.get(name[4:]) in values
    if name == "tag-key":
        return any(v in group.tags for v in values)
    raise _Fail("InvalidParameterValue", f"The filter '{name}' is invalid")


def _item(group: _Group) -> str:
    tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>"
                   for k, v in group.tags.items())
    return (f"<groupName>{escape(group.name)}</groupName><strategy>{group.strategy}</strategy>"
            f"<state>available</state><groupId>{group.group_id}</groupId>"
            f"<groupArn>arn:aws:ec2:{group.region}:{ACCOUNT}:placement-group/{escape(group.name)}"
            f"</groupArn><tagSet>{tags}</tagSet>")


def _alive(region: str, instance_id: str) -> bool:
    from moto.ec2.models import ec2_backends

    try:
        instance = ec2_backends[ACCOUNT][region].get_instance(instance_id)
    except Exception:  # noqa: BLE001 - moto raises its own not-found error: gone
        return False
    return instance.state not in ("terminated",)


def _reply(start_response: Any, status: int, xml: str) -> list[bytes]:
    data = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + xml).encode()
    start_response(f"{status} OK", [("Content-Type", "text/xml;charset=UTF-8"),
                                    ("Content-Length", str(len(data)))])
    return [data]


def _error(start_response: Any, fail: _Fail) -> list[bytes]:
    xml = (f"<Response><Errors><Error><Code>{escape(fail.code)}</Code><Message>"
           f"{escape(fail.message)}</Message></Error></Errors><RequestID>{uuid.uuid4()}"
           "</RequestID></Response>")
    data = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + xml).encode()
    start_response(f"{fail.status} Bad Request", [("Content-Type", "text/xml;charset=UTF-8"),
                                                  ("Content-Length", str(len(data)))])
    return [data]
