"""`burst plan`'s world: the live observation (a dry-run) or a snapshot file, with catalogue fill.

A live dry-run observes exactly as the control loop's observe step does — the policies' queue
sources (built-in or Slurm), the store's nodes, pool controls, planner memory and budget spend,
and the providers' catalogues with refreshed prices — through a store opened **read-only**: the
database itself refuses any write, so the dry-run cannot leave a row behind whatever code path it
reaches. No provider call that changes anything is made (providers only list their catalogue) and
no fabric is called. Where the embedded state file does not exist yet, the fleet is empty and
nothing is created.

A snapshot file is planned as written, except that offerings it does not list are filled from
the same catalogues (as ``burst provider check`` reads them), so an offering is called "not in
the provider catalogue" only when it is not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from orchestrator.domain.offerings import Offering
from orchestrator.domain.snapshot import PolicyMemory, Snapshot
from orchestrator.policy.models import Policy


class LivePlanError(Exception):
    """The world cannot be observed (store unreachable or behind, provider unusable)."""


@dataclass(frozen=True)
class Observed:
    """A snapshot to plan, and what the user should know about how it was made."""

    snapshot: Snapshot
    notes: tuple[str, ...] = ()


def observe_live(settings, policies: list[Policy], now: datetime) -> Observed:
    """Observe the world as the loop would at ``now``, writing nothing (see the module docstring)."""
    from orchestrator.store import Store
    from orchestrator.store.engine import normalize_url, sqlite_file
    from orchestrator.store.migrate import head_revision
    from orchestrator.observe import Observer
    from orchestrator.sources.builtin import BuiltinQueue
    from orchestrator.wiring import queue_source

    notes: list[str] = []
    url = settings.store_url
    path = sqlite_file(normalize_url(url)) if settings.database_url is None else None
    try:
        if path is not None and not path.exists():
            # Nothing to read: plan against an empty fleet in memory, create no file.
            notes.append(f"no state at {path} yet: the fleet and the built-in queue are empty")
            store = Store("sqlite://")
            store.upgrade()
        else:
            store = Store(url, read_only=True)
            revision = store.schema_revision()
            if revision != head_revision():
                store.close()
                raise LivePlanError(
                    f"the state store is at migration {revision or 'none'}, this build needs "
                    f"{head_revision()}: run `burst db upgrade` (or start `burst run`) first")
    except LivePlanError:
        raise
    except Exception as exc:  # noqa: BLE001 - any driver error, reported as one line
        raise LivePlanError(f"cannot open the state store {url.split('@')[-1]}: "
                            f"{type(exc).__name__}: {exc}") from None
    try:
        # Only the observe step of the loop: no executor, no join-token secret, no provider
        # object that prepares disk; the catalogue comes from catalogue_for below.
        policy_map = {p.name: p for p in policies}
        observer = Observer(store, queue_source(store, policy_map, BuiltinQueue(store, policies)),
                            {}, policies=policies)
        snapshot = observer.snapshot(now)
        catalogue, more = catalogue_for(settings, policies)
        notes.extend(more)
        snapshot = replace(snapshot, offerings=catalogue)
    except Exception as exc:  # noqa: BLE001 - a queue source that cannot be read, in one line
        raise LivePlanError(f"cannot observe the world: {type(exc).__name__}: {exc}") from None
    finally:
        store.close()
    return Observed(snapshot, tuple(notes))


def fill_offerings(settings, policies: list[Policy], snapshot: Snapshot) -> Observed:
    """``snapshot`` with the catalogue's rows for the offerings it does not list."""
    catalogue, notes = catalogue_for(settings, policies)
    listed = {o.key for o in snapshot.offerings}
    added = tuple(o for o in catalogue if o.key not in listed)
    if added:
        notes.append(f"{len(added)} offering(s) the snapshot does not list filled from the "
                     "provider catalogues")
    return Observed(replace(snapshot, offerings=snapshot.offerings + added), tuple(notes))


def catalogue_for(settings, policies: list[Policy]) -> tuple[tuple[Offering, ...], list[str]]:
    """Every offering the policies' providers list (bundled catalogue + refreshed prices)."""
    from orchestrator.domain.ports import ProviderError
    from orchestrator.wiring import ProviderUnavailable, catalogue_overrides, provider_offerings

    offerings: dict[str, Offering] = {}
    notes: list[str] = []
    names = sorted({str(spec.provider) for p in policies for spec in p.offerings})
    for name in names:
        try:
            for offering in provider_offerings(name, settings, policies):
                offerings[offering.key] = offering
        except (ProviderUnavailable, ProviderError) as exc:
            notes.append(f"provider {name}: no catalogue ({exc})")
    for override in catalogue_overrides(settings):
        if override.provider in names:
            offerings[override.key] = override
    return tuple(offerings.values()), notes


def assume_sustained(snapshot: Snapshot, policies: list[Policy]) -> Snapshot:
    """``snapshot`` as if every policy's trigger had held for its ``sustained_for`` already."""
    memory = dict(snapshot.memory)
    for policy in policies:
        held = memory.get(policy.name, PolicyMemory())
        since = snapshot.taken_at - policy.trigger.sustained_for
        if held.trigger_since is None or held.trigger_since > since:
            memory[policy.name] = replace(held, trigger_since=since)
    return replace(snapshot, memory=memory)
