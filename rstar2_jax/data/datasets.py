"""Problem datasets: JSONL (and parquet when ``pyarrow`` is importable) records ``{"id", "problem", "answer", ...}``.

Loading is strict: a malformed record raises ``DatasetError`` naming the file, the line (parquet: row,
1-based) and the field, because a silently skipped or mangled record changes what a reported accuracy
means. ``problem`` and ``answer`` must be non-empty strings (an AIME answer written as the number ``25``
is an error; write ``"25"``); ``id`` must be a string when present and defaults to ``"<file stem>-<line>"``.
Other keys are kept in ``Problem.meta``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

REQUIRED = ("problem", "answer")


class DatasetError(ValueError):
    """A malformed record: ``str(e)`` is ``"<path>:<line>: field '<field>': <message>"``."""

    def __init__(self, message: str, *, path: str | os.PathLike | None = None, line: int | None = None,
                 field: str | None = None):
        self.path, self.line, self.field, self.message = (str(path) if path is not None else None), line, field, message
        where = ":".join(str(x) for x in (self.path, line) if x is not None)
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}" if where else f"{what}{message}")


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    id: str
    problem: str  # the question text shown to the policy
    answer: str  # gold final answer (LaTeX, without \boxed{})
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # every other key of the record

    def to_record(self) -> dict[str, Any]:
        return {"id": self.id, "problem": self.problem, "answer": self.answer, **self.meta}


def iter_jsonl(path: str | os.PathLike, *, shard: tuple[int, int] | None = None
               ) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; bad UTF-8, bad JSON or a non-object ->
    ``DatasetError`` naming the file and the line. ``shard=(s, S)``: only the records whose index among
    the non-blank lines is ``s`` mod ``S`` (the others are skipped unparsed: one process's share)."""
    path = Path(path).expanduser()
    record = -1
    with open(path, "rb") as f:  # decoded per line, so an undecodable byte is named by its line
        for lineno, raw_bytes in enumerate(f, start=1):
            if shard is not None:
                if not raw_bytes.strip():
                    continue
                record += 1
                if record % shard[1] != shard[0]:
                    continue
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DatasetError(f"not valid UTF-8 (byte 0x{raw_bytes[e.start]:02x} at column {e.start + 1}); "
                                   "re-encode the file as UTF-8", path=path, line=lineno) from None
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise DatasetError(f"invalid JSON ({e.msg} at column {e.colno})", path=path, line=lineno) from None
            if not isinstance(obj, dict):
                raise DatasetError(f"expected a JSON object, got {type(obj).__name__}", path=path, line=lineno)
            yield lineno, obj


def parse_problem(obj: Mapping[str, Any], *, path: str | os.PathLike | None = None, line: int | None = None,
                  default_id: str | None = None) -> Problem:
    """Validate one record; errors name ``path``/``line`` and the field."""
    for name in REQUIRED:
        if name not in obj:
            raise DatasetError("missing", path=path, line=line, field=name)
        value = obj[name]
        if not isinstance(value, str):
            raise DatasetError(f"must be a string, got {type(value).__name__} {str(value)[:40]!r}",
                               path=path, line=line, field=name)
        if not value.strip():
            raise DatasetError("is empty", path=path, line=line, field=name)
    pid = obj.get("id", default_id)
    if not isinstance(pid, str) or not pid:
        raise DatasetError(f"must be a non-empty string, got {pid!r}", path=path, line=line, field="id")
    meta = {k: v for k, v in obj.items() if k not in ("id", "problem", "answer")}
    return Problem(id=pid, problem=obj["problem"], answer=obj["answer"], meta=meta)


def _check_unique(problems: list[Problem], lines: list[int], path: Path) -> None:
    first: dict[str, int] = {}
    for p, line in zip(problems, lines):
        if p.id in first:
            raise DatasetError(f"duplicate id {p.id!r} (first at line {first[p.id]})", path=path, line=line,
                               field="id")
        first[p.id] = line


def load_jsonl(path: str | os.PathLike, *, limit: int | None = None) -> list[Problem]:
    """All problems of a JSONL file, in file order (the first ``limit`` when given)."""
    path = Path(path).expanduser()
    problems, lines = [], []
    for lineno, obj in iter_jsonl(path):
        if limit is not None and len(problems) >= limit:
            break
        problems.append(parse_problem(obj, path=path, line=lineno, default_id=f"{path.stem}-{lineno}"))
        lines.append(lineno)
    _check_unique(problems, lines, path)
    return problems


def load_parquet(path: str | os.PathLike, *, limit: int | None = None) -> list[Problem]:
    """All problems of a parquet file; needs ``pyarrow`` (not a dependency). Errors name the 1-based row."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {path} needs pyarrow, which is not installed (pip install pyarrow), "
                          "or convert the file to JSONL") from None
    path = Path(path).expanduser()
    rows = pq.read_table(path).to_pylist()
    if limit is not None:
        rows = rows[:limit]
    problems = [parse_problem(row, path=path, line=i, default_id=f"{path.stem}-{i}") for i, row in enumerate(rows, 1)]
    _check_unique(problems, list(range(1, len(problems) + 1)), path)
    return problems


def load_dataset(path: str | os.PathLike, *, limit: int | None = None) -> list[Problem]:
    """Load ``*.jsonl`` or ``*.parquet`` (by suffix) from any path."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.suffix == ".parquet":
        return load_parquet(path, limit=limit)
    if path.suffix in (".jsonl", ".json", ".ndjson"):
        return load_jsonl(path, limit=limit)
    raise DatasetError(f"unknown dataset format {path.suffix!r}; expected .jsonl or .parquet", path=path)


def write_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any] | Any]) -> int:
    """Write one JSON object per line (objects with ``to_record()`` are converted); returns the count.

    Written to a temporary file in the same directory and renamed, so a reader never sees half a file.
    """
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for rec in records:
                if hasattr(rec, "to_record"):
                    rec = rec.to_record()
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                n += 1
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n
