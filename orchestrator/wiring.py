"""The composition root: settings, and the one place that picks concrete parts.

Settings come from ``BURST_*`` environment variables or a YAML settings file (``BURST_SETTINGS_FILE``
or ``--settings``), through pydantic-settings. :func:`build_runtime` turns settings and policies
into a wired :class:`Runtime`: store, providers, queue source, fabric, executor, reconciler and
observer. Nothing else in ``orchestrator`` imports ``providers``.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from orchestrator.domain.ports import Provider
from orchestrator.executor import Executor, ExecutorConfig
from orchestrator import __version__
from orchestrator.fabric.bootstrap import NodeInstall
from orchestrator.fabric.builtin import BuiltinFabric
from orchestrator.fabric.tokens import JoinTokens
from orchestrator.instruments import InstrumentedProvider
from orchestrator.logs import LogFormat
from orchestrator.observe import Observer
from orchestrator.policy.models import Policy, ProviderName, QueueSourceKind
from orchestrator.policy.units import Duration
from orchestrator.reconciler import Reconciler, ReconcilerConfig
from orchestrator.settings_sources import SECRETS_DIR_VAR, file_sources
from orchestrator.sources.builtin import BuiltinQueue
from orchestrator.store import Store, default_sqlite_url

log = logging.getLogger(__name__)


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "burst"


class Settings(BaseSettings):
    """Service settings (not policy): where state lives, how often to tick, where agents call."""

    model_config = SettingsConfigDict(env_prefix="BURST_", extra="forbid")

    state_dir: Path = Field(default_factory=default_state_dir,
                            description="Directory for the SQLite state file, secrets and local nodes.")
    database_url: str | None = Field(default=None,
                                     description="SQLAlchemy URL of the state store; default SQLite in state_dir.")
    tick_s: float = Field(default=10.0, gt=0, description="Seconds between control-loop ticks.")
    cost_rollup_s: float = Field(
        default=300.0, gt=0,
        description="Seconds between cost-ledger roll-ups of beat's burst.cost.rollup (ticks also roll up).")
    api_host: str = Field(default="127.0.0.1", description="Address the controller API binds.")
    api_port: int = Field(default=8787, ge=0, le=65535, description="Port of the controller API (0: any free).")
    controller_url: str | None = Field(default=None,
                                       description="URL agents use to reach the controller; default from api_host/port.")
    log_level: str = Field(default="INFO", description="Python logging level.")
    log_format: LogFormat = Field(
        default=LogFormat.TEXT,
        description="Log lines as text, or json: one object a line with time, level, logger, "
                    "message and the policy/node/job/decision ids where known.")
    secret_key: SecretStr | None = Field(default=None,
                                         description="Key join tokens derive from; default a generated key file in state_dir.")
    local_boot_delay_s: float = Field(default=2.0, ge=0, description="Simulated boot time of local-provider nodes.")
    settings_file: Path | None = Field(default=None, description="YAML file these settings were read from.")
    secrets_dir: Path | None = Field(
        default=None,
        description="Directory of secret files, one per setting named like its variable "
                    "(BURST_SECRET_KEY), read after the BURST_* and BURST_*_FILE variables.")
    policy_files: list[Path] = Field(
        default_factory=list,
        description="Policies the control plane runs (workers and beat); default: the shipped default.")
    broker_url: str = Field(default="redis://127.0.0.1:6379/0", description="Celery broker (Redis).")
    result_backend: str = Field(default="redis://127.0.0.1:6379/1", description="Celery result backend.")
    redis_url: str | None = Field(default=None,
                                  description="Redis for the leader lease (default: the broker URL).")
    visibility_timeout_s: float = Field(
        default=3600.0, gt=0,
        description="Seconds before Redis redelivers an unacknowledged task (longer than any task).")
    lease_s: float | None = Field(default=None, gt=0,
                                  description="Leader lease per policy (default: 3 x tick_s).")
    register_burst: float = Field(
        default=30.0, ge=1, le=1_000_000,
        description="Anonymous agent registrations one client address may make at once (the API's "
                    "token bucket; 429 past it).")
    register_per_s: float = Field(
        default=2.0, gt=0, le=1_000_000,
        description="Registrations a second refilled per client address.")
    node_package: str = Field(
        default="",
        description="What cloud nodes pip-install for the agent: a requirement or a wheel URL; "
                    "default burst==<this version> (from node_wheel_dir's URL when that is set).")
    node_index_url: str = Field(
        default="", description="Package index cloud nodes install burst from (pip --index-url); "
                                "default pip's own.")
    node_wheel_dir: Path | None = Field(
        default=None,
        description="Directory of burst wheels the API serves to cloud nodes at "
                    "/v1/agent/wheels/NAME; set, nodes install this version's wheel from there.")
    decision_retention: Duration = Field(
        default=timedelta(days=30),
        description="How long decisions are kept after they were last made (like 30d or 12h); "
                    "older ones are pruned hourly by the embedded loop and by beat.")
    usage_retention: Duration = Field(
        default=timedelta(days=400),
        description="How long measured GPU use is kept: job aggregates last measured longer ago "
                    "and node-hour roll-ups of older hours are pruned with the decisions.")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Then BURST_*_FILE, BURST_SECRETS_DIR, BURST_SETTINGS_FILE (orchestrator.settings_sources).
        return (init_settings, env_settings, *file_sources(settings_cls))

    @model_validator(mode="after")
    def _secrets_dir_from_the_variable(self) -> Settings:
        # The directory is read before the settings file: one named only there would be ignored.
        named = os.environ.get(SECRETS_DIR_VAR)
        if self.secrets_dir is not None and (not named or Path(named) != self.secrets_dir):
            raise ValueError(f"secrets_dir: set it with the {SECRETS_DIR_VAR} variable, which is "
                             "read before the settings file")
        return self

    def node_install(self, controller_url: str | None = None) -> NodeInstall:
        """How cloud nodes install burst (this controller's version, pinned)."""
        package = self.node_package
        if not package and self.node_wheel_dir is not None:
            url = (controller_url or self.agent_url()).rstrip("/")
            package = f"{url}/v1/agent/wheels/burst-{__version__}-py3-none-any.whl"
        return NodeInstall(__version__, package, self.node_index_url)

    @property
    def store_url(self) -> str:
        return self.database_url or default_sqlite_url(self.state_dir)

    def agent_url(self, port: int | None = None) -> str:
        if self.controller_url:
            return self.controller_url.rstrip("/")
        host = "127.0.0.1" if self.api_host in ("0.0.0.0", "::") else self.api_host
        return f"http://{host}:{port if port is not None else self.api_port}"

    def secret(self) -> bytes:
        """The controller secret; generated once into state_dir (mode 0600) if not configured."""
        if self.secret_key is not None:
            return self.secret_key.get_secret_value().encode()
        path = self.state_dir / "secret.key"
        if not path.exists():
            # Several processes may start at once on a fresh state dir: write the key to a private
            # file, then link it into place atomically; whoever links first wins, all read that.
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".secret.key.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32))
                handle.flush()
                os.fsync(handle.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        return path.read_text().strip().encode()


class SystemClock:
    """Wall-clock time, timezone-aware UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ProviderUnavailable(Exception):
    """A policy names a provider that cannot be built here."""


def build_provider(name: str, settings: Settings, policies: Iterable[Policy] = (), *,
                   options: dict[str, Any] | None = None) -> Provider:
    """Build the provider adapter named in the policies, from their ``providers.<name>`` settings.

    Policies that use the same cloud must agree on its settings: one adapter serves them all.
    ``sim`` (the simulator's virtual cloud) sells every offering the policies name, whatever their
    provider, at its catalogue price (see :func:`sim_catalogue`); ``options`` are its knobs:
    ``clock``, ``seed``, and ``boot`` / ``rates`` as dicts of ``BootTime`` / ``SimRates`` fields.
    """
    from providers import load_provider_class

    policies = list(policies)
    if name == ProviderName.SIM:
        from providers.sim import BootTime, SimRates

        cls = load_provider_class("sim")
        knobs = dict(options or {})
        if isinstance(knobs.get("boot"), dict):
            knobs["boot"] = BootTime(**knobs["boot"])
        if isinstance(knobs.get("rates"), dict):
            knobs["rates"] = SimRates(**knobs["rates"])
        return cls(sim_catalogue(policies), **knobs)
    if name == ProviderName.LOCAL:
        cls = load_provider_class("local")
        return cls(settings.state_dir / "local-provider", boot_delay_s=settings.local_boot_delay_s)
    configs = {p.name: getattr(p.providers, name, None) for p in policies}
    distinct = {c.model_dump_json() for c in configs.values() if c is not None}
    if not distinct:
        raise ProviderUnavailable(f"provider {name!r}: no policy gives providers.{name} settings")
    if len(distinct) > 1:
        raise ProviderUnavailable(
            f"provider {name!r}: policies {', '.join(sorted(configs))} give different providers.{name} "
            "settings; one controller runs one adapter per provider")
    config = next(c for c in configs.values() if c is not None)
    locations = {(o.region, o.zone) for p in policies for o in p.offerings if str(o.provider) == name}
    try:
        cls = load_provider_class(name)
    except (ValueError, ImportError) as exc:
        raise ProviderUnavailable(
            f"provider {name!r} cannot be loaded here ({exc}); install burst[{name}]") from exc
    if name == ProviderName.AWS:
        return cls(config, regions={region for region, _ in locations})
    if name == ProviderName.GCP:
        zones = {zone for _, zone in locations if zone}
        if not zones:
            raise ProviderUnavailable("provider 'gcp': every gcp offering needs a zone")
        return cls(config, zones=zones)
    if name == ProviderName.LIBCLOUD:
        regions = {region for region, _ in locations}
        return cls(config, region=next(iter(regions)) if len(regions) == 1 else None)
    raise ProviderUnavailable(f"provider {name!r} has no adapter in this build")


def provider_offerings(name: str, settings: Settings, policies: Iterable[Policy] = ()) -> list:
    """What provider ``name`` sells, building nothing that writes (the local provider's state
    directory is not created): the catalogue a dry-run plans against."""
    if name == ProviderName.LOCAL:
        from providers.local import default_offerings

        return default_offerings()
    if name == ProviderName.SIM:  # its catalogue needs no provider (nor the clock one needs)
        return sim_catalogue(policies)
    return build_provider(name, settings, policies).offerings()


def sim_catalogue(policies: Iterable[Policy]) -> list:
    """The sim provider's catalogue: the rows each policy offering resolves against in
    production (the bundled AWS/GCP catalogue of its region, the local provider's offerings, the
    policy's libcloud sizes), relabelled as sold by ``sim``. Only the bundled prices are used (no
    refreshed overrides), so a simulation is reproducible."""
    from providers import catalog
    from providers.local import default_offerings
    from providers.sim import as_sim

    rows: dict[str, Any] = {}
    for policy in policies:
        for spec in policy.offerings:
            source = str(spec.provider)
            if source in catalog.KNOWN_PROVIDERS:
                found = [o for o in catalog.offerings_for(source, {spec.region})
                         if o.instance_type == spec.instance_type]
            elif source == ProviderName.LOCAL:
                found = [o for o in default_offerings()
                         if o.instance_type == spec.instance_type and o.region == spec.region]
            elif source == ProviderName.LIBCLOUD and policy.providers.libcloud is not None:
                from orchestrator.domain.offerings import Offering
                from orchestrator.policy.models import Market

                size = policy.providers.libcloud.sizes.get(spec.instance_type)
                found = [] if size is None else [Offering(
                    "libcloud", spec.region, spec.zone, spec.instance_type, Market.ON_DEMAND,
                    size.gpus, float(size.price_usd_hour), size.gpu_model)]
            else:
                found = []  # a sim offering: the policy gives its GPUs and price
            for offering in found:
                relabelled = as_sim(offering)
                rows.setdefault(relabelled.key, relabelled)
    return sorted(rows.values(), key=lambda o: o.key)


def capacity_prior():
    """Offering key -> the published prior preemption hazard (the bundled Spot Advisor buckets;
    :func:`orchestrator.domain.capacity.bucket_prior`)."""
    from orchestrator.domain.capacity import bucket_prior
    from providers import catalog

    return bucket_prior(catalog.interruption_buckets())


def catalogue_overrides(settings: Settings) -> tuple:
    path = settings.state_dir / CATALOG_OVERRIDES
    if not path.exists():
        return ()
    from providers import catalog

    return tuple(catalog.load_overrides(path))


@dataclass
class Runtime:
    """Everything the loop, API and CLI need, wired together."""

    settings: Settings
    store: Store
    policies: dict[str, Policy]
    providers: dict[str, Provider]
    queue: BuiltinQueue
    fabric: Any  # a Fabric port: the FabricRouter over the builtin, Slurm and torch fabrics
    tokens: JoinTokens
    clock: Any
    executor: Executor
    reconciler: Reconciler
    observer: Observer
    extras: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        self.store.close()


def build_runtime(
    settings: Settings,
    policies: Iterable[Policy],
    *,
    clock: Any | None = None,
    controller_url: str | None = None,
    upgrade: bool = True,
    providers: dict[str, Provider] | None = None,
    reconciler_config: ReconcilerConfig | None = None,
    store: Store | None = None,
) -> Runtime:
    """Wire a runtime for the given policies (the embedded defaults unless settings say otherwise).

    ``store``: an open store to use instead of opening the settings' one (``burst plan``'s
    read-only view); it is used as it is, never migrated."""
    policy_map = {p.name: p for p in policies}
    for policy in policy_map.values():
        if policy.queue.source not in (QueueSourceKind.BUILTIN, QueueSourceKind.SLURM):
            raise ProviderUnavailable(
                f"policy {policy.name}: queue source {policy.queue.source} is not available in this "
                "build; use queue: {source: builtin} or {source: slurm}")
    if store is None:
        store = Store(settings.store_url)
        if upgrade:
            store.upgrade()
    if providers is None:
        providers = {}
        for policy in policy_map.values():
            for spec in policy.offerings:
                if str(spec.provider) not in providers:
                    # Timed and error-counted for /metrics (orchestrator.instruments).
                    providers[str(spec.provider)] = InstrumentedProvider(build_provider(
                        str(spec.provider), settings, policy_map.values()))
    clock = clock or SystemClock()
    queue = BuiltinQueue(store, list(policy_map.values()))
    fabric = _fabric(store, policy_map, clock, BuiltinFabric(queue))
    tokens = JoinTokens(settings.secret())
    executor = Executor(store, providers, fabric, clock, tokens, policy_map,
                        ExecutorConfig(controller_url=controller_url or settings.agent_url(),
                                       node_install=settings.node_install(controller_url),
                                       node_env={"BURST_LOG_LEVEL": settings.log_level,
                                                 "BURST_LOG_FORMAT": settings.log_format.value}))
    reconciler = Reconciler(store, fabric, policy_map, reconciler_config or ReconcilerConfig())
    observer = Observer(store, queue_source(store, policy_map, queue), providers,
                        catalogue_overrides(settings), policies=policy_map.values(),
                        capacity_prior=capacity_prior())
    return Runtime(settings, store, policy_map, providers, queue, fabric, tokens, clock,
                   executor, reconciler, observer)


def queue_source(store: Store, policies: dict[str, Policy], builtin: BuiltinQueue) -> Any:
    """The built-in queue, plus Slurm for the pools whose queue.source is slurm."""
    slurm = [p for p in policies.values() if p.queue.source is QueueSourceKind.SLURM]
    if not slurm:
        return builtin
    from orchestrator.sources.composite import QueueSources
    from orchestrator.sources.slurm import SlurmQueue

    return QueueSources(builtin, SlurmQueue(store, slurm))


def _fabric(store: Store, policies: dict[str, Policy], clock: Any, builtin: BuiltinFabric) -> Any:
    """The fabric of each policy (fabric.kind) behind one router; builtin for the rest."""
    from orchestrator.fabric.router import FabricRouter
    from orchestrator.policy.fabric import FabricKind

    by_policy: dict[str, Any] = {}
    slurm = {n: p for n, p in policies.items() if p.fabric_kind is FabricKind.SLURM}
    if slurm:
        from orchestrator.fabric.slurm import SlurmFabric

        fabric = SlurmFabric(store, slurm, clock)
        by_policy.update(dict.fromkeys(slurm, fabric))
    torch = {n: p for n, p in policies.items() if p.fabric_kind is FabricKind.TORCH_ELASTIC}
    if torch:
        from orchestrator.fabric.torch_elastic import TorchElasticFabric

        fabric = TorchElasticFabric(store, torch, clock)
        by_policy.update(dict.fromkeys(torch, fabric))
    return FabricRouter(builtin, by_policy)


# -- operator commands that need concrete providers (used by the CLI) ------------------------------

CATALOG_OVERRIDES = "catalog-overrides.json"


def check_provider(name: str, settings: Settings, policies: list[Policy]) -> tuple[list, list]:
    """Verify credentials and permissions of a provider (dry run) and list the offerings it would use."""
    from orchestrator.domain.ports import CheckRow, ProviderError
    from orchestrator.planner.offerings import resolve_candidates

    rows: list[CheckRow] = []
    try:
        provider = build_provider(name, settings, policies)
    except ProviderUnavailable as exc:
        return [CheckRow("configure", False, str(exc))], []
    except ProviderError as exc:  # e.g. libcloud: a key variable the policy names is unset
        return [CheckRow("credentials", False, f"{exc.kind}: {exc}")], []
    rows.append(CheckRow("configure", True, f"{type(provider).__name__} built from the policy"))
    check = getattr(provider, "check", None)
    if check is not None:
        import inspect

        kwargs = {}
        if "offerings" in inspect.signature(check).parameters:
            # Dry-run only what the policies would launch, not the whole catalogue.
            try:
                catalogue = tuple(provider.offerings())
            except ProviderError:
                catalogue = ()
            kwargs["offerings"] = [c.offering for p in policies
                                   for c in resolve_candidates(p, catalogue, (), SystemClock().now())[0]
                                   if c.offering.provider == name]
        try:
            for row in check(**kwargs):
                label, ok, detail = row
                rows.append(CheckRow(str(label), bool(ok), str(detail)))
        except ProviderError as exc:
            rows.append(CheckRow("dry run", False, f"{exc.kind}: {exc}"))
    try:
        catalogue = tuple(provider.offerings())
        rows.append(CheckRow("offerings", True, f"{len(catalogue)} offerings in the catalogue"))
    except ProviderError as exc:
        rows.append(CheckRow("offerings", False, f"{exc.kind}: {exc}"))
        catalogue = ()
    usable = []
    for policy in policies:
        candidates, rejected = resolve_candidates(policy, catalogue, (), SystemClock().now())
        usable.extend(c.offering for c in candidates if c.offering.provider == name)
        for option in rejected:
            if option.offering_key.startswith(f"{name}/"):
                rows.append(CheckRow(f"offering {option.offering_key}", False, option.rejected or ""))
    return rows, usable


def refresh_catalog(settings: Settings, policies: list[Policy]) -> tuple[int, Path]:
    """Refresh spot prices and GPU facts from the providers' APIs into the state dir's overrides."""
    from providers import catalog

    regions = {o.region for p in policies for o in p.offerings if o.provider == ProviderName.AWS}
    types = {o.instance_type for p in policies for o in p.offerings if o.provider == ProviderName.AWS}
    if not regions:
        raise ProviderUnavailable("no policy uses provider aws: GCP and libcloud prices have no "
                                  "public price API to refresh from; the bundled catalogue is used")
    from providers.aws import make_session, typed_error

    profile = next((p.providers.aws.profile for p in policies if p.providers.aws), None)
    try:
        session = make_session(profile)
        refreshed = catalog.refresh_aws(session, regions, types)
    except Exception as exc:
        typed = typed_error(exc)  # botocore's errors as the typed ones (AuthError, ...)
        if typed is None:
            raise
        raise typed from exc
    path = settings.state_dir / CATALOG_OVERRIDES
    path.parent.mkdir(parents=True, exist_ok=True)
    catalog.write_overrides(path, refreshed)
    return len(refreshed), path


def credential_problems(providers: dict[str, Provider]) -> list[tuple[str, str]]:
    """``(provider, what it said)`` for each provider whose credential chain yields nothing
    (adapters with a ``credentials_problem()``: AWS and GCP; no API call is made)."""
    found = []
    for name, provider in sorted(providers.items()):
        probe = getattr(provider, "credentials_problem", None)
        problem = probe() if probe is not None else None
        if problem:
            found.append((name, problem))
    return found


def catalog_offerings(provider: str, settings: Settings) -> list:
    """The bundled catalogue of a provider with any refreshed overrides layered on top."""
    from providers import catalog

    path = settings.state_dir / CATALOG_OVERRIDES
    return catalog.offerings_for(provider, None, overrides_path=path if path.exists() else None)
