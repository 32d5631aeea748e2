"""Resource policies for the local Compute REST server: compact placement (``groupPlacementPolicy``).

A mixin of :class:`tests.servers.fake_gce.FakeGce`, serving what the Compute Engine REST reference
documents for ``resourcePolicies`` (https://cloud.google.com/compute/docs/reference/rest/v1/
resourcePolicies) and compact placement (https://cloud.google.com/compute/docs/instances/
use-compact-placement-policies)::

    POST   regions/{r}/resourcePolicies?requestId=  resourcePolicies.insert (409 alreadyExists)
    GET    regions/{r}/resourcePolicies/{name}      resourcePolicies.get    (404 notFound)
    GET    regions/{r}/resourcePolicies             resourcePolicies.list
    DELETE regions/{r}/resourcePolicies/{name}      resourcePolicies.delete (400
           resourceInUseByAnotherResource while an instance uses it)
    GET    regions/{r}/operations/{op}              regionOperations.get
    POST   regions/{r}/operations/{op}/wait         regionOperations.wait

and, on instances.insert, ``resourcePolicies`` checked: each must exist (404), be in the
instance's region (400), and a compact policy with ``vmCount`` holds at most that many VMs (400).
A policy must give exactly one of its kinds; ``groupPlacementPolicy.collocation`` is
``COLLOCATED`` or ``UNSPECIFIED_COLLOCATION``. Like instances, the resource exists as soon as the
insert is accepted; its operation is RUNNING for ``op_polls`` polls.
"""

from __future__ import annotations

import json
import re
from typing import Any

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_KINDS = ("groupPlacementPolicy", "snapshotSchedulePolicy", "instanceSchedulePolicy",
          "diskConsistencyGroupPolicy", "workloadPolicy")
_COLLOCATIONS = ("COLLOCATED", "UNSPECIFIED_COLLOCATION")

ROUTES = [
    ("POST", r"regions/(?P<region>[^/]+)/resourcePolicies", "compute.resourcePolicies.insert"),
    ("GET", r"regions/(?P<region>[^/]+)/resourcePolicies", "compute.resourcePolicies.list"),
    ("GET", r"regions/(?P<region>[^/]+)/resourcePolicies/(?P<name>[^/]+)",
     "compute.resourcePolicies.get"),
    ("DELETE", r"regions/(?P<region>[^/]+)/resourcePolicies/(?P<name>[^/]+)",
     "compute.resourcePolicies.delete"),
    ("GET", r"regions/(?P<region>[^/]+)/operations/(?P<op>[^/]+)", "compute.regionOperations.get"),
    ("POST", r"regions/(?P<region>[^/]+)/operations/(?P<op>[^/]+)/wait",
     "compute.regionOperations.wait"),
]


class ResourcePoliciesMixin:
    """The resourcePolicies part of FakeGce (uses its state, operations and errors)."""

    def resource_policies(self, region: str | None = None) -> list[dict[str, Any]]:
        """Every resource policy (of ``region``), as the server stores it."""
        with self._lock:  # type: ignore[attr-defined]
            return [json.loads(json.dumps(b)) for (_, r, _), b in self._policies().items()
                    if region is None or r == region]

    def _policies(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        return self._state.policies  # type: ignore[attr-defined]

    def _resourcePolicies_insert(self, *, project: str, region: str, query: dict[str, str],
                                 body: Any) -> tuple[int, Any]:
        from tests.servers.fake_gce import SELF_LINK_BASE, HttpError

        request_id = query.get("requestId")
        seen = self._state.request_ids.get(request_id) if request_id else None  # type: ignore[attr-defined]
        if seen is not None:
            return 200, self._op_view(self._state.ops[seen])  # type: ignore[attr-defined]
        if not isinstance(body, dict):
            raise HttpError(400, "required", "Required field 'resource' not specified")
        name = body.get("name", "")
        if not _NAME_RE.match(name):
            raise HttpError(400, "invalid", f"Invalid value for field 'resource.name': '{name}'")
        kinds = [k for k in _KINDS if k in body]
        if len(kinds) != 1:
            raise HttpError(400, "invalid", "Exactly one resource policy kind must be specified")
        placement = body.get("groupPlacementPolicy")
        if placement is not None:
            collocation = placement.get("collocation", "UNSPECIFIED_COLLOCATION")
            if collocation not in _COLLOCATIONS:
                raise HttpError(400, "invalid", "Invalid value for field 'resource."
                                f"groupPlacementPolicy.collocation': '{collocation}'")
            if "vmCount" in placement and not 1 <= int(placement["vmCount"]) <= 1500:
                raise HttpError(400, "invalid", "Invalid value for field 'resource."
                                "groupPlacementPolicy.vmCount'")
        key = (project, region, name)
        link = f"{SELF_LINK_BASE}/projects/{project}/regions/{region}/resourcePolicies/{name}"
        if key in self._policies():
            raise HttpError(409, "alreadyExists", f"The resource 'projects/{project}/regions/"
                            f"{region}/resourcePolicies/{name}' already exists", "ALREADY_EXISTS")
        stored = json.loads(json.dumps(body))
        stored.update(kind="compute#resourcePolicy", id=str(self._new_id()),  # type: ignore[attr-defined]
                      creationTimestamp=self._now(), selfLink=link, status="READY",  # type: ignore[attr-defined]
                      region=f"{SELF_LINK_BASE}/projects/{project}/regions/{region}")
        self._policies()[key] = stored
        op = self._new_op(project, region, "insert", link, region_scoped=True)  # type: ignore[attr-defined]
        if request_id:
            self._state.request_ids[request_id] = (project, region, op.body["name"])  # type: ignore[attr-defined]
        return 200, self._op_view(op)  # type: ignore[attr-defined]

    def _resourcePolicies_get(self, *, project: str, region: str, name: str,
                              **_: Any) -> tuple[int, Any]:
        from tests.servers.fake_gce import _not_found

        found = self._policies().get((project, region, name))
        if found is None:
            raise _not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        return 200, json.loads(json.dumps(found))

    def _resourcePolicies_list(self, *, project: str, region: str, query: dict[str, str],
                               **_: Any) -> tuple[int, Any]:
        items = [json.loads(json.dumps(b)) for (p, r, _), b in sorted(self._policies().items())
                 if p == project and r == region]
        out: dict[str, Any] = {"kind": "compute#resourcePolicyList", "id": f"{project}/{region}"}
        if items:
            out["items"] = items
        return 200, out

    def _resourcePolicies_delete(self, *, project: str, region: str, name: str,
                                 **_: Any) -> tuple[int, Any]:
        from tests.servers.fake_gce import HttpError, _not_found

        key = (project, region, name)
        found = self._policies().get(key)
        if found is None:
            raise _not_found(f"projects/{project}/regions/{region}/resourcePolicies/{name}")
        users = [i.body["selfLink"] for i in self._state.instances.values()  # type: ignore[attr-defined]
                 if _uses(i.body, found["selfLink"])]
        if users:
            raise HttpError(400, "resourceInUseByAnotherResource",
                            f"The resource_policy resource 'projects/{project}/regions/{region}/"
                            f"resourcePolicies/{name}' is already being used by '{users[0]}'")
        op = self._new_op(project, region, "delete", found["selfLink"],  # type: ignore[attr-defined]
                          lambda o: self._policies().pop(key, None), region_scoped=True)
        return 200, self._op_view(op)  # type: ignore[attr-defined]

    def _regionOperations_get(self, *, project: str, region: str, op: str,
                              **_: Any) -> tuple[int, Any]:
        return self._poll(project, region, op)  # type: ignore[attr-defined]

    def _regionOperations_wait(self, *, project: str, region: str, op: str,
                               **_: Any) -> tuple[int, Any]:
        return self._poll(project, region, op)  # type: ignore[attr-defined]

    def _check_instance_policies(self, project: str, zone: str, body: dict[str, Any]) -> None:
        """instances.insert's checks of the policies a VM names (see the module docstring)."""
        from tests.servers.fake_gce import HttpError

        region = zone.rsplit("-", 1)[0]
        for ref in body.get("resourcePolicies", []):
            parts = ref.split("/")
            try:
                at = parts.index("regions")
                ref_region, name = parts[at + 1], parts[-1]
            except (ValueError, IndexError):
                raise HttpError(400, "invalid", f"Invalid resource policy '{ref}'") from None
            found = self._policies().get((project, ref_region, name))
            if found is None:
                raise HttpError(404, "notFound", f"The resource 'projects/{project}/regions/"
                                f"{ref_region}/resourcePolicies/{name}' was not found")
            if ref_region != region:
                raise HttpError(400, "invalid", f"Resource policy '{name}' is in region "
                                f"{ref_region}, not the instance's region {region}")
            limit = (found.get("groupPlacementPolicy") or {}).get("vmCount")
            used = sum(1 for i in self._state.instances.values()  # type: ignore[attr-defined]
                       if _uses(i.body, found["selfLink"]))
            if limit is not None and used >= int(limit):
                raise HttpError(400, "invalid", f"Resource policy '{name}' already holds its "
                                f"vmCount of {limit} VM(s)")


def _uses(instance: dict[str, Any], link: str) -> bool:
    tail = link.split("/projects/", 1)[-1]
    return any(ref.endswith(tail) for ref in instance.get("resourcePolicies", []))
