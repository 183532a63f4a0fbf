"""The shard job: plan a corpus into shards, build them (local processes or Ray), write the manifest and index.

`audiopipe.shard(corpus, out, preset=..., ...)` runs the job, as `audiopipe shard` does, and returns its summary:
this package can be called; the call is audiopipe.shard.api.shard (its docstring lists every option).

May import: `audiopipe.corpus` (what is sharded), `audiopipe.decode` (audio in), `audiopipe.features` (what is
computed), `audiopipe.text` (phones and tokens written with the features), `audiopipe.index` (the length
index written beside the shards), `audiopipe.storage` (durable writes, locks, object storage), `audiopipe.presets`
(the model families' feature sets), `audiopipe.version` (recorded in the manifest).
"""

from __future__ import annotations

import inspect as _inspect  # not `inspect`: the submodule audiopipe.shard.inspect binds that name here
import sys
import types
from typing import Any


def _job() -> Any:
    from audiopipe.shard.api import shard

    return shard


class _CallablePackage(types.ModuleType):
    # `import audiopipe as ap; ap.shard(...)`: the job's entry point has the package's name. A function of that
    # name in audiopipe/__init__ would be replaced by this package the first time any audiopipe.shard.* module is
    # imported (the import system binds a sub-package on its parent), so the package itself is what gets called.
    # It shows the function's signature (inspect.signature reads __signature__) and, to help(), its docstring:
    # a property on the class wins over the module's own __doc__ (the notes above, for developers).
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _job()(*args, **kwargs)

    @property
    def __signature__(self) -> _inspect.Signature:
        return _inspect.signature(_job())

    @property
    def __doc__(self) -> str:  # type: ignore[override]
        return f"shard{_inspect.signature(_job())}\n\n{_inspect.getdoc(_job())}"


sys.modules[__name__].__class__ = _CallablePackage
