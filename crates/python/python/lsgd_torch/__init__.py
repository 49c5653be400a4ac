"""lsgd-torch: lsgd-host's sandboxed WebAssembly training policies inside PyTorch.

One ``.wasm`` drives both ``lsgd-host run`` and a PyTorch script, and ``lsgd-host trace`` /
``compare`` remain the proof that they agree: the clock, the train-state, parameter checks,
the sandbox's limits and the codecs' seeds are lsgd-host's own runtime (``lsgd_torch._native``).

- ``WasmLR``: a schedule plugin as an ``LRScheduler``;
- ``WasmLabelSmoothing``, ``WasmBatchSize``: the step's ε and global batch;
- ``WasmLayerRate``: LARS/LAMB-style per-tensor rates around an SGD or AdamW;
- ``WasmSync``, ``sync_hook``: a sync plugin (local SGD, post-local SGD, DiLoCo) around any
  optimizer over ``torch.distributed``: when the ranks average, and the outer step;
- ``CodecState``, ``codec_hook``: a codec plugin as a DDP comm hook, with error feedback;
- ``check_ranks``: every rank runs the same plugins at the same step and state;
- ``exit_ranks``: ends a gloo job's ranks without torch's abort at interpreter exit;
- ``PluginFault``: a plugin's fault (trap, fuel, deadline, invalid output), never a crash;
- ``plugin_dirs()``: where a plugin's bare name is looked up (``LSGD_PLUGIN_PATH``, then the
  reference plugins inside this package).
"""

from ._native import CONTRACTS, blake3_hex, plugin_dirs, sample_bucket
from .comm import CodecState, codec_hook
from .errors import PluginFault
from .layer_rate import WasmLayerRate
from .policies import WasmBatchSize, WasmLabelSmoothing
from .ranks import RanksDiffer, check_ranks, exit_ranks
from .scheduler import WasmLR
from .sync import WasmSync, sync_hook

__all__ = [
    "CONTRACTS",
    "CodecState",
    "PluginFault",
    "RanksDiffer",
    "WasmBatchSize",
    "WasmLR",
    "WasmLabelSmoothing",
    "WasmLayerRate",
    "WasmSync",
    "blake3_hex",
    "check_ranks",
    "codec_hook",
    "exit_ranks",
    "plugin_dirs",
    "sample_bucket",
    "sync_hook",
]
