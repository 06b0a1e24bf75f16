"""PyTorch Flight Recorder dumps read safely: the pickle torch writes (``_dump_fr_trace``, the file
``TORCH_FR_DUMP_TEMP_FILE`` + rank) or its JSON (``_dump_fr_trace_json``), one per rank.

A dump is read with ``PlainUnpickler``, which builds only what pickle's own opcodes build (dicts, lists, tuples,
strings, numbers, booleans, None) and refuses every class or function a pickle names (``find_class``) and every
persistent id: a hostile pickle is refused before anything in it runs, never ``pickle.load``-ed. The rank is the
one the file name gives (``rank3``), else the number it ends with, as torch appends the rank to its prefix.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
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
TRAILING_NUMBER: Final = re.compile(r"(?<![0-9])([0-9]{1,9})(?:\.json|\.pkl|\.pickle)?$")
"""A dump's rank where its name says no ``rank``: the number it ends with, as torch appends the rank to
``TORCH_FR_DUMP_TEMP_FILE`` (``/tmp/job_fr_3``)."""
MAX_DUMP_BYTES: Final = 64 << 20  # torch's default 2,000 entries with their stacks are well under a MiB


class DumpError(ValueError):
    """A file that is not a Flight Recorder dump, or one that may not be read; the message names the file."""


class PlainUnpickler(pickle.Unpickler):
    """Builds plain containers only: any global a pickle names (a class to build, a function to call) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise DumpError(f"the pickle names {module}.{name}: a Flight Recorder dump holds only plain values")

    def persistent_load(self, pid: Any) -> Any:
        raise DumpError("the pickle refers to a persistent object: a Flight Recorder dump holds only plain values")


REFUSED_OPCODES: Final = frozenset(
    {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"}
    | {"PERSID", "BINPERSID"}
)
"""Opcodes that name, call or build an object: refused before ``load`` runs any opcode."""
MEMO_PUTS: Final = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def _checked(data: bytes) -> None:
    """Every opcode read before any runs: one that names a class or calls a function is refused, naming what it
    names; a memo index past the opcodes so far is refused (C pickle sizes its memo by the index: a 13-byte
    pickle can ask for gigabytes)."""
    strings: list[str] = []
    for count, (opcode, argument, _position) in enumerate(pickletools.genops(data), start=1):
        if opcode.name in REFUSED_OPCODES:
            named = str(argument).replace(" ", ".") if opcode.name == "GLOBAL" else ".".join(strings[-2:])
            what = f"names {named}" if named else f"builds an object ({opcode.name})"
            raise DumpError(f"the pickle {what}: a Flight Recorder dump holds only plain values")
        if opcode.name in MEMO_PUTS and isinstance(argument, int) and argument > count:
            raise DumpError(f"the pickle's memo index {argument} is past its {count} opcodes: not a dump of torch's")
        if isinstance(argument, str):
            strings.append(argument)


def plain_loads(data: bytes) -> Any:
    """``data`` unpickled with ``PlainUnpickler``, once ``_checked``."""
    _checked(data)
    return PlainUnpickler(io.BytesIO(data)).load()


def read_dump(path: Path) -> FrDump:
    """One rank's dump, pickle or JSON; a ``DumpError`` naming the file and the problem otherwise."""
    size = path.stat().st_size
    if size > MAX_DUMP_BYTES:
        raise DumpError(f"{path}: {size} bytes, over {MAX_DUMP_BYTES}: not a Flight Recorder dump")
    try:
        return parse_dump(path.read_bytes(), path.name)
    except DumpError as error:
        raise DumpError(f"{path}: {error}") from None


def parse_dump(data: bytes, name: str, rank: int | None = None) -> FrDump:
    """One rank's dump from its bytes, its rank ``rank`` or else the one its file ``name`` names; a ``DumpError``
    saying what is wrong otherwise."""
    try:
        document = json.loads(data) if data.lstrip()[:1] == b"{" else plain_loads(data)
    except DumpError:
        raise
    except UNREADABLE as error:
        raise DumpError(f"neither a Flight Recorder pickle nor its JSON ({type(error).__name__}: {error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("entries"), list):
        raise DumpError("no 'entries' list: not a Flight Recorder dump (torch's _dump_fr_trace)")
    if rank is None:
        named = RANK_IN_NAME.search(name) or TRAILING_NUMBER.search(name)
        if named is None:
            raise DumpError("no rank in the file name: torch names a dump by its rank (nccl_trace_rank_3)")
        rank = int(named.group(1))
    return FrDump(
        rank=rank,
        file=name,
        version=str(document.get("version", "?")),
        pg_config=_mapping(document.get("pg_config")),
        pg_status=_mapping(document.get("pg_status")),
        entries=[_kept(entry) for entry in document["entries"] if isinstance(entry, dict)],
    )


KEPT: Final = frozenset(
    {
        "collective_seq_id",
        "p2p_seq_id",
        "is_p2p",
        "pg_id",
        "process_group",
        "profiling_name",
        "input_sizes",
        "output_sizes",
        "input_dtypes",
        "state",
        "retired",
    }
)
"""What the report reads of an entry (its stack frames, thread and times are left out: a fraction of the size)."""


def _kept(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in entry.items() if key in KEPT}


def as_document(dump: FrDump) -> dict[str, Any]:
    """The dump as JSON-able plain values (what the service stores), read back by ``parse_dump`` of its JSON."""
    return {
        "version": dump.version,
        "pg_config": dict(dump.pg_config),
        "pg_status": dict(dump.pg_status),
        "entries": [dict(entry) for entry in dump.entries],
    }


def _mapping(value: Any) -> dict[str, Any]:
    return {str(key): item for key, item in value.items()} if isinstance(value, dict) else {}
