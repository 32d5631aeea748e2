"""FakeProvider: an in-memory, recording implementation of the ``Provider`` Protocol.

Modelled on Karpenter's fake cloudprovider: it keeps the contract the real adapters keep
(idempotent ``launch`` on the request id, ownership by tags, idempotent ``terminate``, typed
errors carrying provider/offering/request id) and adds knobs for tests:

* ``calls``: every call, in order, as ``(method, argument)``;
* ``next_errors[method]``: a list of exceptions; each call of ``method`` pops and raises the first
  one (before doing anything), so a test scripts failures call by call;
* ``lost_responses[method]``: the same, but raised *after* the call took effect (the request
  reached the cloud, the answer never came back: a timeout, or the caller crashed);
* ``capacity_keys``: launches of these offering keys raise :class:`CapacityError`;
* ``set_state(id, state)`` / ``vanish(id)``: move an instance along, or drop it from every view
  (as a provider that forgot it, or a listing that lags);
* ``reset()``: back to empty.

A terminated instance stays listed as ``terminated`` (like EC2 for about an hour) until
``forget_terminated()``; callers must treat that state as gone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import (
    CapacityError,
    Instance,
    InstanceState,
    LaunchRequest,
    ProviderError,
)

CLUSTER_TAG = "burst:cluster"


@dataclass
class FakeProvider:
    """See the module docstring. ``name`` must match the offerings' provider field."""

    name: str = "aws"
    catalogue: list[Offering] = field(default_factory=list)
    now: Callable[[], datetime] | None = None  # launched_at source; None leaves it unset
    instances: dict[str, Instance] = field(default_factory=dict)
    by_request: dict[str, str] = field(default_factory=dict)  # request id -> instance id
    requests: dict[str, LaunchRequest] = field(default_factory=dict)  # instance id -> request
    calls: list[tuple[str, object]] = field(default_factory=list)
    next_errors: dict[str, list[BaseException]] = field(default_factory=dict)
    lost_responses: dict[str, list[BaseException]] = field(default_factory=dict)
    capacity_keys: set[str] = field(default_factory=set)
    hidden: set[str] = field(default_factory=set)  # vanished: in no view, not deleted
    _counter: int = 0

    # -- the Protocol -------------------------------------------------------------------------
    def offerings(self) -> list[Offering]:
        self._record("offerings", None)
        return list(self.catalogue)

    def launch(self, req: LaunchRequest) -> list[Instance]:
        self._record("launch", req)
        existing = self.by_request.get(req.request_id)
        if existing is not None:  # idempotent: "already done" returns what the first call made
            return [self.instances[existing]] if existing not in self.hidden else []
        if req.offering.key in self.capacity_keys:
            raise CapacityError(
                f"no capacity for {req.offering.instance_type}", provider=self.name,
                offering_key=req.offering.key, request_id=req.request_id,
                code="InsufficientInstanceCapacity",
            )
        self._counter += 1
        instance = Instance(
            id=f"i-{self._counter:06d}", provider=self.name, state=InstanceState.PENDING,
            tags=req.tags.as_dict(), offering_key=req.offering.key,
            launched_at=self.now() if self.now else None,
        )
        self.instances[instance.id] = instance
        self.by_request[req.request_id] = instance.id
        self.requests[instance.id] = req
        self._lose_response("launch")
        return [instance]

    def describe(self, ids: list[str]) -> list[Instance]:
        self._record("describe", list(ids))
        return [self.instances[i] for i in ids if i in self.instances and i not in self.hidden]

    def list_owned(self, cluster: str) -> list[Instance]:
        self._record("list_owned", cluster)
        return [i for i in self.instances.values()
                if i.tags.get(CLUSTER_TAG) == cluster and i.id not in self.hidden]

    def terminate(self, ids: list[str]) -> None:
        self._record("terminate", list(ids))
        for instance_id in ids:  # unknown or already gone: a normal return
            instance = self.instances.get(instance_id)
            if instance is not None:
                self.instances[instance_id] = replace(instance, state=InstanceState.TERMINATED)
        self._lose_response("terminate")

    # -- test controls ------------------------------------------------------------------------
    def set_state(self, instance_id: str, state: InstanceState) -> None:
        self.instances[instance_id] = replace(self.instances[instance_id], state=state)

    def run_all(self) -> None:
        """Every pending instance is now running (the cloud finished booting them)."""
        for instance in list(self.instances.values()):
            if instance.state is InstanceState.PENDING:
                self.set_state(instance.id, InstanceState.RUNNING)

    def vanish(self, instance_id: str) -> None:
        """The instance disappears from every view (spot reclaim and listing forgotten)."""
        self.hidden.add(instance_id)

    def forget_terminated(self) -> None:
        """Terminated instances drop out of listings, as they do at real providers after a while."""
        for instance in list(self.instances.values()):
            if instance.state is InstanceState.TERMINATED:
                self.hidden.add(instance.id)

    def inject(self, method: str, *errors: BaseException) -> None:
        """Raise ``errors``, one per call of ``method``, before the call does anything."""
        self.next_errors.setdefault(method, []).extend(errors)

    def lose_response(self, method: str, *errors: BaseException) -> None:
        """Raise ``errors``, one per call of ``method``, after the call took effect."""
        self.lost_responses.setdefault(method, []).extend(errors)

    def reset(self) -> None:
        self.instances.clear()
        self.by_request.clear()
        self.requests.clear()
        self.calls.clear()
        self.next_errors.clear()
        self.lost_responses.clear()
        self.capacity_keys.clear()
        self.hidden.clear()
        self._counter = 0

    # -- views for assertions -----------------------------------------------------------------
    def calls_of(self, method: str) -> list[object]:
        return [arg for name, arg in self.calls if name == method]

    def alive(self) -> list[Instance]:
        """Instances that exist (not terminated), hidden ones included: the cloud's truth."""
        return [i for i in self.instances.values() if i.state is not InstanceState.TERMINATED]

    def _record(self, method: str, argument: object) -> None:
        self.calls.append((method, argument))
        queued = self.next_errors.get(method)
        if queued:
            error = queued.pop(0)
            if isinstance(error, ProviderError) and error.provider is None:
                error.provider = self.name
            raise error


    def _lose_response(self, method: str) -> None:
        queued = self.lost_responses.get(method)
        if queued:
            raise queued.pop(0)


def instance_ids(instances: Iterable[Instance]) -> list[str]:
    return sorted(i.id for i in instances)
