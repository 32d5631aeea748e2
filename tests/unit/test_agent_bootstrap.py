"""Unit tests of the node bootstrap document: render/parse round trip, errors, valid bash."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from orchestrator.fabric.bootstrap import (
    BLOCK_BEGIN,
    BLOCK_TERMINATOR,
    ENV_NAMES,
    Bootstrap,
    script_template,
)


def make(**overrides: object) -> Bootstrap:
    values: dict[str, object] = {
        "node_id": "node-7f3a",
        "controller_url": "http://127.0.0.1:8000",
        "join_token": "jt-s3cr3t-token",
        "cluster": "lab",
        "policy": "burst-a100",
        "gpus": 4,
        "gpu_model": "A100-80GB",
        "boot_delay_s": 1.5,
        "heartbeat_s": 0.5,
    }
    values.update(overrides)
    return Bootstrap(**values)  # type: ignore[arg-type]


def test_round_trip() -> None:
    boot = make()
    assert Bootstrap.parse(boot.render()) == boot


def test_round_trip_with_defaults_and_awkward_text() -> None:
    # Quotes, dollars, heredoc-looking and multi-line text must survive both bash and JSON.
    boot = Bootstrap(
        node_id="n'1\"$(x)",
        controller_url="https://ctl.example:8443/burst/",
        join_token="tok'$HOME`id`\nBURST_BOOTSTRAP_JSON\n",
        cluster="c l",
        policy="p;rm -rf /",
        gpus=0,
        gpu_model="",
    )
    parsed = Bootstrap.parse(boot.render())
    assert parsed == boot
    assert parsed.boot_delay_s == 0.0 and parsed.heartbeat_s == 2.0


def test_render_shape() -> None:
    text = make().render()
    assert text.startswith("#!/bin/bash\n")
    assert "exec burst agent" in text
    for name in ENV_NAMES.values():
        assert f"export {name}=" in text
    assert BLOCK_BEGIN in text and f"\n{BLOCK_TERMINATOR}\n" in text
    assert "{exports}" in script_template()  # the template is data, not code


def test_the_template_rendered_is_the_one_in_infra() -> None:
    """Operators read and adapt infra/bootstrap/user-data.sh.tmpl; the package renders exactly it."""
    from pathlib import Path

    infra = Path(__file__).resolve().parents[2] / "infra" / "bootstrap" / "user-data.sh.tmpl"
    assert infra.read_text(encoding="utf-8") == script_template()
    assert infra.read_text(encoding="utf-8").splitlines()[-1] in make().render().splitlines()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    "boot",
    [make(), make(node_id="a'b", join_token="x\ny`z`$(w)", policy='"; exit 1; "')],
    ids=["plain", "awkward"],
)
def test_rendered_script_is_valid_bash(boot: Bootstrap, tmp_path) -> None:
    script = tmp_path / "user-data"
    script.write_text(boot.render())
    result = subprocess.run(
        ["bash", "-n", str(script)], check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_exports_reach_the_environment(tmp_path) -> None:
    # Run the script's export section for real (the exec line is cut off) and read the variables.
    boot = make(join_token="t'$x\"y")
    head = boot.render().split(BLOCK_BEGIN)[0]
    script = tmp_path / "head.sh"
    script.write_text(head + 'python3 -c "import json, os; print(json.dumps(dict(os.environ)))"\n')
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout
    assert Bootstrap.from_env(json.loads(out)) == boot


def test_the_checkpoint_location_round_trips_and_is_exported(tmp_path) -> None:
    boot = make(checkpoint_uri="s3://ckpt/team a/$run")
    assert Bootstrap.parse(boot.render()) == boot
    head = boot.render().split(BLOCK_BEGIN)[0]
    script = tmp_path / "head.sh"
    script.write_text(head + 'printf %s "$BURST_CHECKPOINT_URI"\n')
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout
    assert out == "s3://ckpt/team a/$run"
    with pytest.raises(ValueError, match="checkpoint_uri"):
        make(checkpoint_uri=3)


def replace_json(text: str, document: object) -> str:
    lines = text.splitlines()
    start = lines.index(BLOCK_BEGIN) + 2
    lines[start] = json.dumps(document)
    return "\n".join(lines) + "\n"


def document_of(boot: Bootstrap) -> dict[str, object]:
    lines = boot.render().splitlines()
    return json.loads(lines[lines.index(BLOCK_BEGIN) + 2])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: "#!/bin/bash\necho hi\n", "marked block"),
        (lambda t: t.split(BLOCK_TERMINATOR + "\n")[0], "not closed"),
        (lambda t: t.replace(f": <<'{BLOCK_TERMINATOR}'", ": <<EOF"), "heredoc"),
        (lambda t: replace_json(t, "{not json"), "not a JSON object"),
        (lambda t: t.replace('"version": 1', '"version": 99'), "version"),
        (lambda t: t.replace('"gpus": 4, ', ""), "missing field(s) gpus"),
        (lambda t: t.replace('"gpus": 4', '"gpus": 4, "extra": 1'), "unknown field(s) extra"),
        (lambda t: t.replace('"gpus": 4', '"gpus": "four"'), "'gpus' must be an integer"),
        (lambda t: t.replace('"gpus": 4', '"gpus": true'), "'gpus' must be an integer"),
        (
            lambda t: t.replace('"heartbeat_s": 0.5', '"heartbeat_s": 0'),
            "'heartbeat_s' must be > 0",
        ),
        (lambda t: t.replace('"node_id": "node-7f3a"', '"node_id": ""'), "'node_id'"),
        (
            lambda t: t.replace('"http://127.0.0.1:8000"', '"127.0.0.1:8000"'),
            "controller_url must start with http",
        ),
    ],
)
def test_malformed_input_raises_value_error(mutate, message: str) -> None:
    text = make().render()
    broken = mutate(text)
    assert broken != text
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Bootstrap.parse(broken)


def test_invalid_json_text_in_block() -> None:
    lines = make().render().splitlines()
    lines[lines.index(BLOCK_BEGIN) + 2] = "{not json"
    with pytest.raises(ValueError, match="not valid JSON"):
        Bootstrap.parse("\n".join(lines))


def test_non_text_input() -> None:
    with pytest.raises(ValueError, match="must be text"):
        Bootstrap.parse(b"#!/bin/bash")  # type: ignore[arg-type]


def test_from_env_requires_the_variables() -> None:
    with pytest.raises(ValueError, match="BURST_NODE_ID"):
        Bootstrap.from_env({})
    env = {ENV_NAMES[k]: str(v) for k, v in document_of(make()).items() if k in ENV_NAMES}
    env[ENV_NAMES["gpus"]] = "many"
    with pytest.raises(ValueError, match="burst bootstrap environment"):
        Bootstrap.from_env(env)


def test_repr_hides_the_join_token() -> None:
    assert "jt-s3cr3t-token" not in repr(make())


def test_the_dead_man_switch_fields_round_trip_and_are_checked() -> None:
    boot = make(controller_lease_s=90, self_terminate="shutdown -h now")
    parsed = Bootstrap.parse(boot.render())
    assert parsed == boot and parsed.controller_lease_s == 90.0
    assert "export BURST_SELF_TERMINATE='shutdown -h now'" in boot.render()
    env = {ENV_NAMES[k]: str(v) for k, v in vars(boot).items()}
    assert Bootstrap.from_env(env) == boot
    assert make().controller_lease_s == 1800.0 and make().self_terminate == ""  # 30m, none
    for bad in (0, -1, float("inf"), "30m", True):
        with pytest.raises(ValueError, match="controller_lease_s"):
            make(controller_lease_s=bad)
    with pytest.raises(ValueError, match="self_terminate"):
        make(self_terminate=None)


def test_aws_and_gcp_instances_can_stop_themselves_libcloud_and_local_cannot() -> None:
    from providers.aws import AwsProvider
    from providers.gcp import GcpProvider
    from providers.libcloud_driver import LibcloudProvider
    from providers.local import LocalProvider

    assert AwsProvider.self_terminate_command == "shutdown -h now"
    assert GcpProvider.self_terminate_command == "shutdown -h now"
    assert LibcloudProvider.self_terminate_command is None
    assert LocalProvider.self_terminate_command is None
