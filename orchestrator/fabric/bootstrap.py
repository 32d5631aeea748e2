"""Node bootstrap: the user-data document a burst node boots with.

The controller renders a :class:`Bootstrap` into a small bash script (:meth:`Bootstrap.render`).
The local provider writes it to a file for the agent process. The script exports the values as
``BURST_*`` environment variables and execs ``burst agent``; the same values sit, JSON-encoded,
in a marked block that :meth:`Bootstrap.parse` reads back, so the agent never has to interpret
shell.

Cloud providers get a ``#cloud-config`` document instead (:meth:`Bootstrap.render_cloud_config`,
infra/bootstrap/cloud-config.yaml.tmpl): it writes that script to ``/etc/burst/bootstrap.sh``,
the agent's settings and its systemd unit, installs the pinned burst (:class:`NodeInstall`: from
a package index, or a wheel the controller serves) unless the image has it, and starts the unit.
:meth:`Bootstrap.parse` reads either document.

Standard library only: this module is imported by the node agent on a bare cloud node.
"""

from __future__ import annotations

import functools
import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

FORMAT_VERSION = 1

# The block delimiter is also a bash heredoc terminator: ``: <<'X' ... X`` is a no-op to bash, so
# the script stays runnable while carrying data. json.dumps never emits a newline inside its
# output, so the JSON line can never collide with the terminator line.
BLOCK_BEGIN = "# --- burst bootstrap (do not edit below; parsed by the node agent) ---"
BLOCK_TERMINATOR = "BURST_BOOTSTRAP_JSON"

# The user-data script template: infra/bootstrap/user-data.sh.tmpl (shipped inside the package
# as fabric/templates/user-data.sh.tmpl, a link to it). ``str.format`` fields: node_id_comment,
# exports, block_begin, terminator, json. Read on first render only: a node parses, never renders.
TEMPLATE_NAME = "user-data.sh.tmpl"


# The cloud-config a cloud node boots with, and the two files it writes besides the script.
CLOUD_CONFIG_TEMPLATE = "cloud-config.yaml.tmpl"
INSTALL_TEMPLATE = "install-burst.sh.tmpl"
AGENT_UNIT = "burst-agent.service"
CLOUD_CONFIG_HEADER = "#cloud-config"


@functools.cache
def template(name: str) -> str:
    """A template of fabric/templates (links to infra/bootstrap/)."""
    return (Path(__file__).parent / "templates" / name).read_text(encoding="utf-8")


def script_template() -> str:
    """The user-data template text (see ``TEMPLATE_NAME``)."""
    return template(TEMPLATE_NAME)


@dataclass(frozen=True)
class NodeInstall:
    """How a cloud node gets burst: ``pip install`` of ``package`` (default ``burst==VERSION``,
    or a wheel's URL) from ``index_url`` (default pip's), checked to be ``version``."""

    version: str
    package: str = ""
    index_url: str = ""

    def pip_args(self) -> str:
        args = ["--index-url", self.index_url] if self.index_url else []
        return " ".join(shlex.quote(a) for a in (*args, self.package or f"burst=={self.version}"))


def _block(text: str, indent: int = 6) -> str:
    """``text`` as the body of a YAML literal block (``|``) at ``indent`` spaces."""
    pad = " " * indent
    return "\n".join(pad + line if line else "" for line in text.rstrip("\n").split("\n"))


# Bootstrap field -> environment variable the script exports (and from_env reads back).
ENV_NAMES = {
    "node_id": "BURST_NODE_ID",
    "controller_url": "BURST_CONTROLLER_URL",
    "join_token": "BURST_JOIN_TOKEN",
    "cluster": "BURST_CLUSTER",
    "policy": "BURST_POLICY",
    "gpus": "BURST_GPUS",
    "gpu_model": "BURST_GPU_MODEL",
    "boot_delay_s": "BURST_BOOT_DELAY_S",
    "heartbeat_s": "BURST_HEARTBEAT_S",
    "controller_lease_s": "BURST_CONTROLLER_LEASE_S",
    "self_terminate": "BURST_SELF_TERMINATE",
    "checkpoint_uri": "BURST_CHECKPOINT_URI",
}

DEFAULT_CONTROLLER_LEASE_S = 1800.0  # the policy's timeouts.controller_lease default (30m)

_REQUIRED_TEXT = ("node_id", "controller_url", "join_token", "cluster", "policy")


@dataclass(frozen=True)
class Bootstrap:
    """What a node needs to find the controller and prove it was launched by it."""

    node_id: str
    controller_url: str
    join_token: str
    cluster: str
    policy: str
    gpus: int
    gpu_model: str
    boot_delay_s: float = 0.0
    heartbeat_s: float = 2.0
    # The dead-man switch: no answer from the controller this long, and the node drains itself
    # and runs ``self_terminate`` (a shell command; empty: the provider gives no way to).
    controller_lease_s: float = DEFAULT_CONTROLLER_LEASE_S
    self_terminate: str = ""
    # Where the node's jobs write checkpoints (the policy's ``storage.checkpoints`` for the
    # node's project, else the pool's; empty: none declared). Jobs get it as BURST_CHECKPOINT_URI.
    checkpoint_uri: str = ""

    def __post_init__(self) -> None:
        for name in _REQUIRED_TEXT:
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"bootstrap field {name!r} must be a non-empty string")
        for name in ("gpu_model", "self_terminate", "checkpoint_uri"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"bootstrap field {name!r} must be a string")  # noqa: TRY004
        if not self.controller_url.startswith(("http://", "https://")):
            raise ValueError(
                f"bootstrap controller_url must start with http:// or https://, "
                f"got {self.controller_url!r}"
            )
        # bool is an int subclass; True GPUs is a bug, not a count.
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 0:
            raise ValueError(f"bootstrap field 'gpus' must be an integer >= 0, got {self.gpus!r}")
        for name, minimum_exclusive in (
                ("boot_delay_s", None), ("heartbeat_s", 0.0), ("controller_lease_s", 0.0)):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ValueError(f"bootstrap field {name!r} must be a finite number, got {value!r}")
            if value < 0 or (minimum_exclusive is not None and value <= minimum_exclusive):
                bound = "> 0" if minimum_exclusive is not None else ">= 0"
                raise ValueError(f"bootstrap field {name!r} must be {bound}, got {value!r}")
            # JSON gives back 2 for 2.0; normalise so a parsed bootstrap equals the rendered one.
            object.__setattr__(self, name, float(value))

    def render(self) -> str:
        """The user-data script (bash, for cloud-init)."""
        # Every field is a plain str or number: a shallow read is what asdict's deep copy gives,
        # at a fraction of its cost (one render per launch).
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        exports = "\n".join(
            f"export {ENV_NAMES[name]}={shlex.quote(str(values[name]))}" for name in ENV_NAMES
        )
        document = {"version": FORMAT_VERSION, **values}
        return script_template().format(
            # A node id is ours, but keep a stray newline from breaking out of the comment.
            node_id_comment=" ".join(self.node_id.split()),
            exports=exports,
            block_begin=BLOCK_BEGIN,
            terminator=BLOCK_TERMINATOR,
            json=json.dumps(document, sort_keys=True),
        )

    def render_cloud_config(self, install: NodeInstall,
                            agent_env: Mapping[str, str] | None = None) -> str:
        """The ``#cloud-config`` user-data of a cloud node (see the module docstring)."""
        env = {"BURST_WORK_DIR": "/var/lib/burst/work", **(agent_env or {})}
        setup = ("/usr/local/lib/burst/install-burst.sh && systemctl daemon-reload && "
                 # --no-block: cloud-init's own unit is still running this command.
                 "systemctl enable --now --no-block burst-agent.service")
        if self.self_terminate:
            # A node that cannot be set up must not idle on the bill until a timeout finds it.
            setup += f" || {{ echo 'burst: node setup failed' >&2; {self.self_terminate}; }}"
        return template(CLOUD_CONFIG_TEMPLATE).format(
            node_id_comment=" ".join(self.node_id.split()),
            version=install.version,
            bootstrap=_block(self.render()),
            agent_env=_block("\n".join(f"{k}={shlex.quote(v)}" for k, v in env.items())),
            install=_block(template(INSTALL_TEMPLATE).format(
                version=install.version, pip_args=install.pip_args())),
            unit=_block(template(AGENT_UNIT)),
            # A JSON string is a YAML double-quoted scalar: no quoting rules of our own.
            setup=json.dumps(setup),
        )

    @classmethod
    def parse(cls, text: str) -> Bootstrap:
        """Read the values back from a script produced by :meth:`render`.

        Raises ValueError saying what is wrong when the block is missing, truncated, not JSON, of
        another format version, or has missing, unknown or ill-typed fields.
        """
        if not isinstance(text, str):
            raise ValueError(f"bootstrap must be text, got {type(text).__name__}")  # noqa: TRY004
        lines = text.splitlines()
        if text.startswith(CLOUD_CONFIG_HEADER):
            # The script sits indented in a YAML block: read it back at its own indentation.
            lines = _dedented_block(lines)
        try:
            # The last marker: an exported value may itself span lines that look like one.
            begin = len(lines) - 1 - lines[::-1].index(BLOCK_BEGIN)
        except ValueError:
            raise ValueError(
                f"not a burst bootstrap: the marked block {BLOCK_BEGIN!r} is missing"
            ) from None
        body = lines[begin + 1 :]
        if not body or body[0] != f": <<'{BLOCK_TERMINATOR}'":
            raise ValueError("malformed burst bootstrap: the block does not open its heredoc")
        try:
            end = body.index(BLOCK_TERMINATOR, 1)
        except ValueError:
            raise ValueError(
                f"malformed burst bootstrap: the block is not closed by {BLOCK_TERMINATOR!r} "
                "(truncated user-data?)"
            ) from None
        raw = "\n".join(body[1:end]).strip()
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"malformed burst bootstrap: the block is not valid JSON ({exc})"
            ) from None
        return cls.from_dict(document)

    @classmethod
    def from_dict(cls, document: object) -> Bootstrap:
        """Build from the JSON document of the block; ValueError when it does not fit."""
        if not isinstance(document, dict):
            message = "malformed burst bootstrap: the block is not a JSON object"
            raise ValueError(message)  # noqa: TRY004 (parse promises ValueError for bad input)
        document = dict(document)
        version = document.pop("version", None)
        if version != FORMAT_VERSION:
            raise ValueError(
                f"unsupported burst bootstrap version {version!r} "
                f"(this agent reads {FORMAT_VERSION})"
            )
        known = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing = sorted(required - document.keys())
        unknown = sorted(document.keys() - known)
        if missing:
            raise ValueError(f"malformed burst bootstrap: missing field(s) {', '.join(missing)}")
        if unknown:
            raise ValueError(f"malformed burst bootstrap: unknown field(s) {', '.join(unknown)}")
        return cls(**document)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Bootstrap:
        """Build from the ``BURST_*`` variables the script exports; ValueError when incomplete."""
        missing = [
            ENV_NAMES[name]
            for name in (*_REQUIRED_TEXT, "gpus", "gpu_model")
            if ENV_NAMES[name] not in env
        ]
        if missing:
            raise ValueError(f"burst bootstrap environment incomplete: {', '.join(missing)} unset")
        values: dict[str, object] = {
            name: env[ENV_NAMES[name]] for name in (*_REQUIRED_TEXT, "gpu_model")
        }
        for name in ("self_terminate", "checkpoint_uri"):
            if ENV_NAMES[name] in env:
                values[name] = env[ENV_NAMES[name]]
        try:
            values["gpus"] = int(env[ENV_NAMES["gpus"]])
            for name in ("boot_delay_s", "heartbeat_s", "controller_lease_s"):
                if ENV_NAMES[name] in env:
                    values[name] = float(env[ENV_NAMES[name]])
        except ValueError as exc:
            raise ValueError(f"burst bootstrap environment: {exc}") from None
        return cls(**values)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        # The dataclass repr would print the join token into any log or traceback that shows us.
        return (
            f"Bootstrap(node_id={self.node_id!r}, controller_url={self.controller_url!r}, "
            f"join_token='***', cluster={self.cluster!r}, policy={self.policy!r}, "
            f"gpus={self.gpus!r}, gpu_model={self.gpu_model!r}, "
            f"boot_delay_s={self.boot_delay_s!r}, heartbeat_s={self.heartbeat_s!r}, "
            f"controller_lease_s={self.controller_lease_s!r}, "
            f"self_terminate={self.self_terminate!r}, checkpoint_uri={self.checkpoint_uri!r})"
        )


def _dedented_block(lines: list[str]) -> list[str]:
    """The lines from the marker on, with the marker line's indentation taken off each."""
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].strip() == BLOCK_BEGIN:
            pad = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
            return [line.removeprefix(pad) for line in lines[index:]]
    return lines
