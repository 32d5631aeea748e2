"""A tiny elastic training job (CPU, gloo) that `burst demo --fabric torch` and the tests run.

Run by ``torchrun`` on every node: a linear regression whose gradients are averaged over the
world with ``all_reduce``. Rank 0 saves a checkpoint (model, optimiser, step, and the history of
every step: world size, loss, restart count) after every step, atomically; every (re)start
resumes from it, so the history is one contiguous run of steps across any number of joins and
drains (``history.json`` beside the checkpoint has it too). It follows burst's drain hooks
(:mod:`orchestrator.fabric.elastic_hooks`): on a checkpoint request it saves, uploads the
checkpoint to ``BURST_CHECKPOINT_URI`` (a ``file://`` one: copied there), confirms and holds
until the leaving node is gone, so the drain waits for the upload.

    torchrun ... orchestrator/fabric/elastic_train.py --checkpoint-dir DIR [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from orchestrator.fabric.elastic_hooks import ElasticControl  # noqa: E402

FEATURES = 8
TRUE_WEIGHTS = torch.arange(1.0, FEATURES + 1.0).unsqueeze(1) / FEATURES


def save(path: Path, model, optimiser, step: int, history: list) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    torch.save({"model": model.state_dict(), "optimiser": optimiser.state_dict(), "step": step,
                "history": history}, tmp)
    os.replace(tmp, path)  # a reader never sees half a checkpoint
    # The history also as JSON, for readers without torch (the demo's summary).
    text = path.with_name(f"history.json.{os.getpid()}.tmp")
    text.write_text(json.dumps(history))
    os.replace(text, path.with_name("history.json"))


def upload(path: Path) -> None:
    """Copy the checkpoint to ``BURST_CHECKPOINT_URI`` (the node's ``storage.checkpoints``)
    when it is a ``file://`` location; a real job uploads to its object store here."""
    uri = os.environ.get("BURST_CHECKPOINT_URI", "")
    if not uri.startswith("file://"):
        return
    target = Path(uri[len("file://"):])
    target.mkdir(parents=True, exist_ok=True)
    tmp = target / f"{path.name}.{os.getpid()}.tmp"
    tmp.write_bytes(path.read_bytes())
    os.replace(tmp, target / path.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-time", type=float, default=0.1, help="seconds per step (pacing)")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)

    # Bounded collectives: a peer that vanished fails the step within seconds, not 30 minutes.
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=args.lr)
    path = args.checkpoint_dir / "checkpoint.pt"
    step, history = 0, []
    if path.exists():
        state = torch.load(path, weights_only=False)
        model.load_state_dict(state["model"])
        optimiser.load_state_dict(state["optimiser"])
        step, history = state["step"], state["history"]
    control = ElasticControl()
    print(json.dumps({"event": "start", "rank": rank, "world": world, "step": step,
                      "restart": restart, "node": os.environ.get("BURST_NODE_ID", "")}), flush=True)
    while step < args.steps:
        checkpoint_now, stop_now = control.poll()
        if checkpoint_now:
            if rank == 0:
                save(path, model, optimiser, step, history)
                upload(path)  # the final checkpoint is safe before the drain hears of it
            control.confirm(step)
            control.hold()
            continue
        if stop_now:
            break
        step += 1
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, FEATURES, generator=generator)
        y = x @ TRUE_WEIGHTS + 0.01 * torch.randn(32, 1, generator=generator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimiser.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimiser.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss = float(mean_loss) / world
        history.append({"step": step, "world": world, "loss": mean_loss, "restart": restart})
        if rank == 0:
            save(path, model, optimiser, step, history)
            print(json.dumps({"event": "step", "step": step, "world": world, "loss": mean_loss,
                              "restart": restart}), flush=True)
        control.status(step=step, world_size=world, rank=rank, restart=restart)
        time.sleep(args.step_time)
    if rank == 0:
        save(path, model, optimiser, step, history)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
