"""PyTorch Flight Recorder dumps read safely: the pickle torch writes (``_dump_fr_trace``, the file
``TORCH_FR_DUMP_TEMP_FILE`` + rank) or its JSON (``_dump_fr_trace_json``), one per rank.

A dump is read with ``PlainUnpickler``, which builds only what pickle's own opcodes build (dicts, lists, tuples,
strings, numbers, booleans, None) and refuses every class or function a pickle names (``find_class``) and every
persistent id: a hostile pickle is refused before anything in it runs, never ``pickle.load``-ed. The rank is the
file name's trailing number, as torch names its dumps.
"""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path
from typing import Any, Final

from bubblescope.analysis import FrDump
from bubblescope.kineto import RANK_IN_NAME

UNREADABLE: Final = (  # what a malformed pickle's own opcodes, or malformed JSON, raise
    pickle.UnpicklingError,
    EOFError,
    ValueError,  # JSONDecodeError and UnicodeDecodeError among them
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    OverflowError,
    RecursionError,
    MemoryError,  # a length field mutated to gigabytes
)
MAX_DUMP_BYTES: Final = 256 << 20  # a dump of torch's default 2,000 entries is well under a MiB


class DumpError(ValueError):
    """A file that is not a Flight Recorder dump, or one that may not be read; the message names the file."""


class PlainUnpickler(pickle.Unpickler):
    """Builds plain containers only: any global a pickle names (a class to build, a function to call) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(f"the pickle names {module}.{name}: a Flight Recorder dump holds only plain values")

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError("the pickle refers to a persistent object: a Flight Recorder dump holds only plain values")


def plain_loads(data: bytes) -> Any:
    """``data`` unpickled with ``PlainUnpickler``."""
    return PlainUnpickler(io.BytesIO(data)).load()


def read_dump(path: Path) -> FrDump:
    """One rank's dump, pickle or JSON; a ``DumpError`` naming the file and the problem otherwise."""
    size = path.stat().st_size
    if size > MAX_DUMP_BYTES:
        raise DumpError(f"{path}: {size} bytes, over {MAX_DUMP_BYTES}: not a Flight Recorder dump")
    data = path.read_bytes()
    try:
        document = json.loads(data) if data.lstrip()[:1] == b"{" else plain_loads(data)
    except DumpError as error:
        raise DumpError(f"{path}: {error}") from None
    except UNREADABLE as error:
        raise DumpError(
            f"{path}: neither a Flight Recorder pickle nor its JSON ({type(error).__name__}: {error})"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise DumpError(f"{path}: no 'entries' list: not a Flight Recorder dump (torch's _dump_fr_trace)")
    named = RANK_IN_NAME.search(path.name)
    if named is None:
        raise DumpError(f"{path}: no rank in the file name: torch names a dump by its rank (nccl_trace_rank_3)")
    return FrDump(
        rank=int(named.group(1)),
        file=path.name,
        version=str(document.get("version", "?")),
        pg_config=_mapping(document.get("pg_config")),
        pg_status=_mapping(document.get("pg_status")),
        entries=[entry for entry in document["entries"] if isinstance(entry, dict)],
    )


def _mapping(value: Any) -> dict[str, Any]:
    return {str(key): item for key, item in value.items()} if isinstance(value, dict) else {}
