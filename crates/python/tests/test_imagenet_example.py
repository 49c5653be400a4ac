"""examples/python/imagenet_main.py (PyTorch's ImageNet example with lsgd-torch's objects) under
torchrun on fake data: stopped after an epoch and resumed from its checkpoint, read back with
torch's default torch.load(weights_only=True), it continues bit for bit (the losses of every
step and the final parameters equal the uninterrupted run's), its codec hook included."""

import json
import os
import subprocess

from conftest import ROOT, torchrun

EXAMPLE = ROOT / "examples" / "python" / "imagenet_main.py"
# resnet18 at 64 px, 4 steps per epoch of 8 images per rank: the smallest run that has a
# checkpoint between two epochs and buckets of more than one layer. One-cycle moves the rate and
# SGD's momentum every step.
ARGS = ["--dummy", "-a", "resnet18", "--image-size", "64", "--dummy-samples", "64", "-b", "16",
        "--epochs", "2", "-j", "0", "-p", "100", "--schedule", "one-cycle"]


def run(cwd, *extra):
    """One torchrun of the example in `cwd`; returns rank 0's loss log."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [torchrun(), "--standalone", "--nproc_per_node", "2", str(EXAMPLE), *ARGS,
         "--loss-log", "losses.jsonl", *extra],
        cwd=cwd, capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return [json.loads(line) for line in (cwd / "losses.jsonl").read_text().splitlines()]


def test_the_imagenet_example_resumes_bit_for_bit_with_the_codec_hook(tmp_path):
    # The hook's residuals ride on everything else a resume must restore (weights, SGD's
    # momentum buffers, the schedule's clock and one-cycle's momentum, the sample order).
    codec = ["--codec", "codec-top-k", "--codec-param", "density=0.01"]
    whole_dir, split_dir = tmp_path / "whole", tmp_path / "split"
    whole_dir.mkdir()
    split_dir.mkdir()
    whole = run(whole_dir, *codec)
    run(split_dir, *codec, "--stop-epoch", "1")
    assert (split_dir / "checkpoint.pth.tar").is_file()
    split = run(split_dir, *codec, "--resume", "checkpoint.pth.tar")
    steps = [r for r in whole if "loss" in r]
    assert len(steps) == 8 and len({r["lr"] for r in steps}) > 1
    # The split run's log holds the first epoch (before the stop), then the resumed second.
    assert [r for r in split if "loss" in r] == steps
    assert split[-1] == whole[-1] and "params" in whole[-1]
