"""zcta-prof run directories in pandas and DuckDB.

    import zcta_analysis as za
    run = za.load("zcta-runs/<run id>")      # .ops .gpu .proxy .comms .process .phases
    con = za.connect("zcta-runs/<run id>")   # DuckDB views of the same tables
    za.breakdown(run)                        # phase shares per (op, size, engine)
    za.compare("runs/a", "runs/b")           # medians side by side

The per-op phases come from `zcta phases RUN` (the phase model lives in one place,
the zcta CLI; docs/phases.md). Files are taken as zcta takes them (format/src/reader.rs):
the regular files (and links to regular files) named `*.parquet` in a table's directory
and its sub-directories; files of older schema versions read with the missing columns as
NULL; leftovers of killed processes (`_*.wal`, `_*.tmp`) are not read (pending logs are
named: `zcta recover RUN` turns them into Parquet). A file zcta would not use — not
Parquet, truncated, not written by zcta, of a newer schema version, of another table (its
`zcta.table`), or with a column of another type, a required column missing or NULL — is
skipped whole with a warning (`ZctaWarning`) naming it and why, as are links that cannot
be followed or lead to directories; the rest is read. `Run.skipped` lists them.

Integer columns come as pandas' nullable integer dtypes of their Arrow type (`Int64`,
`UInt64`, `Int32`, `UInt32`, ...; NULL is `pd.NA`, and a comparison with it is `pd.NA`),
whether or not they hold NULLs: a time in ns since the epoch (~1.8e18) or a u64 id is
beyond float64's 2^53, where pandas' default for an integer column holding NULLs
(float64) would round it to a multiple of 256 and make two ids that differ in their low
bits equal. Boolean columns (`graph_captured`, ...) come as pandas' `boolean` dtype
(NULL is `pd.NA`) the same way, with or without NULLs: never `object` in one run and
`bool` in another. (DuckDB's `.df()` gives a nullable dtype where a result's column
holds NULLs.)

A row of `ops`, `gpu` or `proxy` with a time outside 1970..2116 (not in `[0, 2^62)` ns
since the epoch: a corrupt or foreign value, such as an end of int64 in a damaged file)
is left out as zcta leaves it out of every figure (src/analysis/mod.rs `MAX_TIME_NS`):
`load`, `read_table` and `connect` do not give it, so no figure computed from them —
`breakdown`, `compare`, `stream_time_ns`, the plots, or the user's own — holds it or
overflows int64 on it. Each file with such rows is named with a warning, as zcta names
it (`skipped FILE: 2 ops rows left out: a time outside 1970..2116 ...`), and listed in
`Run.skipped`. The columns judged are zcta's: the six ops times `api_start_ns`,
`api_end_ns`, `launch_ns`, `gpu_ready_ns`, `gpu_start_ns`, `gpu_end_ns` (its
`ops_times!`), gpu's `start_ns`, `end_ns` (`gpu_times!`) and proxy's `start_ns`,
`stop_ns` and a step's network waits `send_wait_ns`, `recv_wait_ns`,
`recv_flush_wait_ns`, `recv_gpu_wait_ns` (`proxy_times!`); a NULL is no time and in
range. The ops row of a call that succeeded (`result` 0) with `bytes` of 2^62 (4 EiB)
or more, which no buffer holds, is left out too (src/analysis/mod.rs `MAX_BYTES`; the
bytes of a call that returned anything else, an error or ncclInProgress, are what its
caller asked for, and are kept), and its file named
the same way (`skipped FILE: 1 ops row left out: bytes of 2^62 (4 EiB) or more on a
call that succeeded ...`; a file with both kinds is named twice, times first, and a row
with both is counted with the times alone). `zcta summary`'s rows per table still
count them (the rows its files hold), as `process.ops_rows` does; `len(run.ops)` does
not.
"""

from __future__ import annotations

import operator
import os
import pathlib
import re
import stat
import warnings
from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ._schema import COLUMNS, SCHEMA_VERSION

TABLES = ("ops", "gpu", "calls", "comms", "nccl_ops", "proxy", "nccl_comms", "process", "phases")
PHASES = ("init", "queue", "sync", "barrier", "transfer", "memcpy", "proxy", "unresolved")
SCHEMA_VERSION_KEY = b"zcta.schema_version"
TABLE_KEY = b"zcta.table"

# src/analysis/mod.rs MAX_TIME_NS: every time the analysis combines lies in [0, 2^62) ns
# since the epoch (1970..2116); a row holding another is left out.
MAX_TIME_NS = 1 << 62
# The times a row is judged by, per table, as every zcta command judges them
# (src/analysis/mod.rs `ops_times!`, `gpu_times!`, `proxy_times!`). NULL is no time: in
# range.
TIME_COLUMNS = {
    "ops": ("api_start_ns", "api_end_ns", "launch_ns", "gpu_ready_ns", "gpu_start_ns", "gpu_end_ns"),
    "gpu": ("start_ns", "end_ns"),
    "proxy": ("start_ns", "stop_ns", "send_wait_ns", "recv_wait_ns", "recv_flush_wait_ns", "recv_gpu_wait_ns"),
}
# src/analysis/mod.rs MAX_BYTES, `bytes_possible`: an ops row of a call that succeeded
# (`result` 0) with `bytes` of 2^62 (4 EiB) or more, larger than any buffer, is corrupt
# and left out; the bytes of a call that returned anything else (an error, ncclInProgress)
# are what its caller asked for, and are kept. NULL
# bytes are no size: kept. A row out of range by a time is counted under that reason
# alone (`LeftOut::keep_op`).
MAX_BYTES = 1 << 62


class ZctaWarning(UserWarning):
    """A file or directory of a run that was not read, and why (or rows not yet in
    Parquet: pending write-ahead logs; or a file's rows left out: a time out of range,
    a successful call's impossible bytes)."""


# Every time, not once per place in the code: loading the same bad run twice must say so
# twice. Appended: a filter the user set (`-W error`, "ignore") still comes first.
warnings.filterwarnings("always", category=ZctaWarning, append=True)


def _warn(msg: str) -> None:
    """Warns as the caller's line outside this package (the user's `load(...)`)."""
    import sys

    here, level, f = os.path.dirname(__file__), 2, sys._getframe(1)
    while f.f_back is not None and os.path.dirname(f.f_code.co_filename) == here:
        f, level = f.f_back, level + 1
    warnings.warn(f"zcta_analysis: {msg}", ZctaWarning, stacklevel=level)


def _is_parquet_name(name: str) -> bool:
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def _is_log_name(name: str) -> bool:
    return name.startswith("_") and name.endswith(".wal")


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _why(e: OSError) -> str:
    return e.strerror or str(e)


@dataclass
class _Listing:
    parquet: list = field(default_factory=list)
    logs: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # (path, reason)


def _list_files(run: pathlib.Path, table: str) -> _Listing:
    """A table's files as zcta's reader lists them (format/src/reader.rs `walk`): the
    regular files and links to regular files under RUN/TABLE, sub-directories included.
    A link to a directory is not followed (a link to `.` would list every file again);
    it, and a link that cannot be followed (a loop, a dangling link) or an entry that is
    no regular file (FIFO, socket, device) with a table file's name, are skipped with
    the reason. Unlike zcta, a table's directory (or one below it) that cannot be listed
    is named and the rest of the run still read."""
    top = run / table
    listing = _Listing()
    files = []
    stack = [top]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except FileNotFoundError as e:
            if d == top and not os.path.lexists(top):
                continue  # the run has no such table
            listing.skipped.append((d, f"a symbolic link that cannot be followed: {_why(e)}"))
            continue
        except NotADirectoryError:
            listing.skipped.append((d, f"not a directory: no {table} files read from it"))
            continue
        except OSError as e:  # a link loop (ELOOP), no permission, ...
            listing.skipped.append((d, f"cannot be listed: {_why(e)}"))
            continue
        for ent in entries:
            p = pathlib.Path(ent.path)
            name = ent.name
            named = _is_parquet_name(name) or _is_log_name(name)
            try:
                if ent.is_dir(follow_symlinks=False):
                    stack.append(p)
                    continue
                if ent.is_file(follow_symlinks=False):
                    files.append(p)
                    continue
                link = ent.is_symlink()
                mode = os.lstat(p).st_mode
            except OSError as e:
                if named:
                    listing.skipped.append((p, f"cannot be looked at: {_why(e)}"))
                continue
            if link:
                try:
                    mode = os.stat(p).st_mode
                except OSError as e:
                    reason = f"a symbolic link that cannot be followed: {_why(e)}"
                else:
                    if stat.S_ISREG(mode):
                        files.append(p)
                        continue
                    if stat.S_ISDIR(mode):
                        listing.skipped.append((p, "a symbolic link to a directory: not followed"))
                        continue
                    reason = f"a symbolic link to {_kind(mode)}: not opened"
            else:
                reason = f"{_kind(mode)}: not opened"
            if named:
                listing.skipped.append((p, reason))
    files = _skip_copies(files, listing)
    for p in sorted(files):
        if _is_log_name(p.name):
            listing.logs.append(p)
        elif _is_parquet_name(p.name):
            listing.parquet.append(p)
    listing.skipped.sort()
    return listing


def _zcta_name(stem: str) -> bool:
    """Whether a file's stem is one zcta writes (reader.rs `pid_of_stem`): a `p<pid>`
    part after the host."""
    return any(len(x) > 1 and x[0] == "p" and x[1:].isdigit() and x[1:].isascii() for x in stem.split("-"))


def _footer_bytes(path: pathlib.Path):
    """A Parquet file's length and footer bytes (reader.rs `footer_bytes`), or None."""
    try:
        with _open(path) as f:
            n = os.fstat(f.fileno()).st_size
            if n < 8:
                return None
            f.seek(n - 8)
            tail = f.read(8)
            if tail[4:] != b"PAR1":
                return None
            k = int.from_bytes(tail[:4], "little") + 8
            if k > n or k > 64 << 20:
                return None
            f.seek(n - k)
            return n, f.read(k)
    except OSError:
        return None


def _skip_copies(files: list, listing: _Listing) -> list:
    """Leaves out, as zcta's reader does (reader.rs `list_files`, `skip_same_contents`),
    a table file under a name another one nearer the table's directory has (zcta's
    names are one process's own: a copy, or one re-written by another tool), and a
    Parquet file whose length and footer repeat another's under another name (the one
    kept: nearest the table's directory, under zcta's own name before others, then the
    first by path); each named in `listing.skipped`."""
    def size(p):
        try:
            return os.stat(p).st_size
        except OSError:
            return None

    seen, kept = {}, []
    for p in sorted(files, key=lambda p: (len(p.parts), str(p))):
        if not (_is_parquet_name(p.name) or _is_log_name(p.name)):
            kept.append(p)
            continue
        first = seen.get(p.name)
        if first is None:
            seen[p.name] = p
            kept.append(p)
        elif size(first) == size(p):
            listing.skipped.append((p, f"a copy of {first} (the same name): not read twice"))
        else:
            listing.skipped.append((p, f"another file under the name of {first} (other bytes: a copy re-written, "
                                       "or an edit): not read twice; the one nearest the table's directory is read"))
    by_bytes = {}
    parquet = [p for p in kept if _is_parquet_name(p.name)]
    order = sorted(parquet, key=lambda p: (len(p.parts), not _zcta_name(p.name.removesuffix(".parquet")), str(p)))
    copies = set()
    for p in order:
        key = _footer_bytes(p)
        if key is None:
            continue
        if key in by_bytes:
            copies.add(p)
            listing.skipped.append((p, f"a copy of {by_bytes[key]} (the same bytes): not read twice"))
        else:
            by_bytes[key] = p
    return [p for p in kept if p not in copies]


def _open(path: pathlib.Path):
    """A binary file object of a regular file; never blocks on a FIFO (one may have
    replaced the file since it was listed). Opened by descriptor, so a name that is not
    UTF-8 (a host name in another encoding) opens too."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{_kind(st.st_mode)}: not opened")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _version(kv: dict) -> tuple[int | None, str | None]:
    """The file's schema version, or why the file is not used (reader.rs `check_version`)."""
    v = kv.get(SCHEMA_VERSION_KEY)
    if v is None:
        return None, "no zcta.schema_version in the file metadata: not written by zcta"
    try:
        s = v.decode("utf-8")
    except UnicodeDecodeError:
        return None, f"bad schema version {v!r}"
    if not re.fullmatch(r"\+?[0-9]+", s) or int(s) >= 1 << 32:
        return None, f"bad schema version {s!r}"
    n = int(s)
    if n > SCHEMA_VERSION:
        return None, f"written with schema version {n}, newer than this zcta_analysis's {SCHEMA_VERSION}; upgrade zcta_analysis"
    return n, None


def _footer_problem(pf: pq.ParquetFile, table: str) -> str | None:
    """Why a file of `table` is not used, from its footer alone (None: it is, as far as
    the footer tells)."""
    kv = pf.metadata.metadata or {}
    version, why = _version(kv)
    if why:
        return why
    own = kv.get(TABLE_KEY)
    if own is not None and own != table.encode():
        return f"a file of table {own.decode('utf-8', 'replace')!r} (its zcta.table), not of {table}"
    schema = pf.schema_arrow
    names = schema.names
    for name, typ, nullable in COLUMNS[table]:
        if name not in names:
            if not nullable:
                return f"schema version {version}: required column {name} is missing"
            continue
        have = schema.field(names.index(name)).type
        if have != pa.type_for_alias(typ):
            return f"schema version {version}: column {name} has type {have}, expected {typ}"
    return None


def _left_out(rows: int, table: str) -> str:
    """Why `rows` rows of a file of `table` were left out, in zcta's words
    (src/analysis/mod.rs `out_of_range`)."""
    what = f"{rows} {table} row" + ("" if rows == 1 else "s")
    return (
        f"{what} left out: a time outside 1970..2116 (not in [0, 2^62) ns since the epoch: "
        "a corrupt or foreign value); its other rows were used"
    )


def _bytes_left_out(rows: int) -> str:
    """Why `rows` ops rows of a file were left out for bytes no successful call moves,
    in zcta's words (src/analysis/mod.rs `bytes_out_of_range`)."""
    what = f"{rows} ops row" + ("" if rows == 1 else "s")
    return (
        f"{what} left out: bytes of 2^62 (4 EiB) or more on a call that succeeded "
        "(larger than any buffer: a corrupt value); its other rows were used"
    )


def _notes(f, table: str, times: int, size: int) -> list:
    """The (path, reason) of file `f` of `table` per reason rows were left out, in
    zcta's order (src/analysis/mod.rs `LeftOut::name`): `times` rows for a time out of
    range, then `size` ops rows for impossible bytes."""
    return ([(f, _left_out(times, table))] if times else []) + ([(f, _bytes_left_out(size))] if size else [])


def _judged(table: str, names) -> dict:
    """The columns among `names` that a row of `table` is judged by, each with the end
    of the range [0, end) whose values are surely kept: the times (TIME_COLUMNS,
    MAX_TIME_NS) and, for ops, `bytes` (MAX_BYTES: bytes below it are kept whatever the
    call's result) and `result`, which the bytes rule reads (no end: None)."""
    out = {c: MAX_TIME_NS for c in TIME_COLUMNS.get(table, ()) if c in names}
    if table == "ops":
        out.update({c: end for c, end in (("bytes", MAX_BYTES), ("result", None)) if c in names})
    return out


def _time_rule(f, name: str):
    """The time rule, in form `f` (`_ArrowForm`, `_PandasForm`, `_SqlForm`): column
    `name` holds no time out of range, [0, MAX_TIME_NS); a NULL is no time, in range."""
    return f.fill(f.and_(f.ge(name, 0), f.lt(name, MAX_TIME_NS)), True)


def _bytes_rule(f):
    """The bytes rule (src/analysis/mod.rs `bytes_possible`), in form `f` (`_ArrowForm`,
    `_PandasForm`, `_SqlForm`): the call was refused (`result` not 0) or its `bytes`
    lie below MAX_BYTES. NULL bytes are no size: below. A NULL `result` counts as a
    success, the row judged by its bytes (zcta's `result` is required, never NULL; a
    file holding one is skipped by `load`, and here every form judges it alike)."""
    return f.or_(f.fill(f.ne("result", 0), False), f.fill(f.lt("bytes", MAX_BYTES), True))


class _ArrowForm:
    """The rules' operations on the columns of a pyarrow Table (as `_read_file` gives
    them: an integer column compared with a bound of its own type)."""

    def __init__(self, t: pa.Table):
        self.t = t

    def _cmp(self, fn, name: str, v: int):
        c = self.t.column(name)
        return fn(c, pa.scalar(v, c.type) if pa.types.is_integer(c.type) else v)

    def ge(self, name, v):
        import pyarrow.compute as pc

        return self._cmp(pc.greater_equal, name, v)

    def lt(self, name, v):
        import pyarrow.compute as pc

        return self._cmp(pc.less, name, v)

    def ne(self, name, v):
        import pyarrow.compute as pc

        return self._cmp(pc.not_equal, name, v)

    @staticmethod
    def and_(a, b):
        import pyarrow.compute as pc

        return pc.and_(a, b)

    @staticmethod
    def or_(a, b):
        import pyarrow.compute as pc

        return pc.or_(a, b)

    @staticmethod
    def fill(a, v: bool):
        import pyarrow.compute as pc

        return pc.fill_null(a, v)


class _PandasForm:
    """The rules' operations on the columns of a DataFrame: integers held as objects, or
    in pyarrow's dtypes (whose comparison of a uint64 with a Python int goes through
    float64: 2^62 - 1 < 2^62 is false there), made pandas' exact nullable integers first;
    a comparison NULL (pd.NA) where the value is NULL, whatever the dtype (float64's
    NaN too, which compares False)."""

    def __init__(self, df: pd.DataFrame):
        self.df = df

    def _cmp(self, op, name: str, v: int) -> pd.Series:
        c = _ints(self.df[name], "UInt64" if name == "bytes" else "Int64")
        if isinstance(c.dtype, pd.ArrowDtype) and c.dtype.pyarrow_dtype in _PANDAS_DTYPES:
            c = c.astype(_PANDAS_DTYPES[c.dtype.pyarrow_dtype])
        return op(c, v).astype("boolean").mask(c.isna().to_numpy())

    def ge(self, name, v):
        return self._cmp(operator.ge, name, v)

    def lt(self, name, v):
        return self._cmp(operator.lt, name, v)

    def ne(self, name, v):
        return self._cmp(operator.ne, name, v)

    and_ = staticmethod(operator.and_)
    or_ = staticmethod(operator.or_)

    @staticmethod
    def fill(a: pd.Series, v: bool) -> pd.Series:
        return a.fillna(v).astype(bool)


class _SqlForm:
    """The rules' operations as DuckDB SQL text over a row's columns (no parentheses
    added: the rules nest only `fill(and_(..))` and `or_(fill, fill)`)."""

    @staticmethod
    def _q(name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def ge(self, name, v):
        return f"{self._q(name)} >= {v}"

    def lt(self, name, v):
        return f"{self._q(name)} < {v}"

    def ne(self, name, v):
        return f"{self._q(name)} <> {v}"

    @staticmethod
    def and_(a, b):
        return f"{a} and {b}"

    @staticmethod
    def or_(a, b):
        return f"{a} or {b}"

    @staticmethod
    def fill(a, v: bool):
        return f"coalesce({a}, {'true' if v else 'false'})"


def _rules_sql(table: str, cols) -> tuple[str, str]:
    """SQL over the judged columns `cols` of `table` that a row has: (no time out of
    range, its bytes possible); "true" where the columns for a rule are missing."""
    times, size = _masks(_SqlForm(), cols, table)
    return times or "true", size or "true"


def _masks(f, names, table: str):
    """(no time out of range, bytes possible) per row in form `f` over a table's columns
    `names`, each None where the table lacks every column of its rule."""
    times = None
    for name in TIME_COLUMNS.get(table, ()):
        if name in names:
            ok = _time_rule(f, name)
            times = ok if times is None else f.and_(times, ok)
    size = _bytes_rule(f) if table == "ops" and "bytes" in names and "result" in names else None
    return times, size


def _kept(t: pa.Table, table: str) -> tuple[pa.Table, int, int]:
    """`t` without its damaged rows, and how many were left out for each reason: a time
    out of range ([0, MAX_TIME_NS) in the columns TIME_COLUMNS names; a NULL is in
    range), then, of the other ops rows, bytes a successful call cannot have moved
    (`_bytes_rule`)."""
    import pyarrow.compute as pc

    times, size = _masks(_ArrowForm(t), t.column_names, table)
    if times is None and size is None:
        return t, 0, 0
    if times is None:
        times = pa.repeat(True, t.num_rows)
    keep = times if size is None else pc.and_(times, size)
    kept = pc.sum(keep).as_py() or 0
    if kept == t.num_rows:
        return t, 0, 0
    in_range = pc.sum(times).as_py() or 0
    return t.filter(keep), t.num_rows - in_range, in_range - kept


def _ops_kept(ops: pd.DataFrame, who: str) -> pd.Series:
    """Which rows of an ops DataFrame zcta keeps (plain bools): no time out of range,
    and bytes a successful call can have moved (the rules `_kept` applies, in pandas);
    warns of the others, per reason. A frame from `load` or `read_table` has none left
    out (they were left out there, each file named): this is for frames built
    otherwise, which should hold exact integers (a float64 column rounds bytes of
    2^62 - 1 to 2^62, and the row is left out)."""
    times, size = _masks(_PandasForm(ops), ops.columns, "ops")
    if times is None:
        times = pd.Series(True, index=ops.index)
    keep = times if size is None else times & size
    n = int((~times).sum())
    if n:
        _warn(f"{who}: {_left_out(n, 'ops')}")
    n = int((times & ~keep).sum())
    if n:
        _warn(f"{who}: {_bytes_left_out(n)}")
    return keep


def _required_nulls(t: pa.Table, table: str) -> str | None:
    for name, _, nullable in COLUMNS[table]:
        if not nullable and name in t.column_names and t.column(t.column_names.index(name)).null_count:
            return f"required column {name} holds NULLs"
    return None


def _read_file(path: pathlib.Path, table: str) -> tuple[pa.Table | None, str | None]:
    """One file of `table`, every known column in the schema's order and type (NULL
    where an older file lacks a nullable one), then the file's other columns; or None
    and why it is skipped."""
    try:
        fh = _open(path)
    except OSError as e:
        return None, f"cannot open: {_why(e)}"
    with fh:
        try:
            pf = pq.ParquetFile(fh)
            why = _footer_problem(pf, table)
        except Exception as e:  # truncated, not Parquet, a corrupt footer or Arrow schema
            return None, f"not a readable Parquet file (truncated or corrupt?): {e}"
        if why:
            return None, why
        try:
            t = pf.read()
        except Exception as e:
            return None, f"corrupt data: {e}"
    why = _required_nulls(t, table)
    if why:
        return None, why
    names = t.column_names
    cols, fields, seen = [], [], set()
    for name, typ, _ in COLUMNS[table]:
        seen.add(name)
        ty = pa.type_for_alias(typ)
        fields.append(pa.field(name, ty))
        cols.append(t.column(names.index(name)) if name in names else pa.chunked_array([pa.nulls(t.num_rows, ty)]))
    for i, f in enumerate(t.schema):
        if f.name in seen:  # a known column (its first instance is used) or a repeated name
            if names.index(f.name) != i:
                _warn(f"{path}: column {f.name} appears more than once: the first is read")
            continue
        seen.add(f.name)
        fields.append(pa.field(f.name, f.type))
        cols.append(t.column(i))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields)), None


# Arrow integer and boolean types -> pandas' nullable dtypes: exact values, NULL as
# pd.NA, the same dtype whether or not a column holds NULLs (pyarrow's default gives
# float64 for an integer column with NULLs, object for a boolean one).
_PANDAS_DTYPES = {
    pa.bool_(): pd.BooleanDtype(),
    pa.int8(): pd.Int8Dtype(),
    pa.int16(): pd.Int16Dtype(),
    pa.int32(): pd.Int32Dtype(),
    pa.int64(): pd.Int64Dtype(),
    pa.uint8(): pd.UInt8Dtype(),
    pa.uint16(): pd.UInt16Dtype(),
    pa.uint32(): pd.UInt32Dtype(),
    pa.uint64(): pd.UInt64Dtype(),
}


def _to_pandas(t: pa.Table) -> pd.DataFrame:
    """A table as a DataFrame whose integer columns keep their exact values (a nullable
    integer dtype whether or not the column holds NULLs) and whose boolean columns are
    pandas' `boolean` (likewise), other columns as pyarrow converts them."""
    return t.to_pandas(types_mapper=_PANDAS_DTYPES.get)


def _read_usable(f: pathlib.Path, table: str) -> tuple[pa.Table | None, list]:
    """One file of `table` as `load` uses it: read (`_read_file`), less its damaged rows
    (`_kept`); the (path, reason) of the file, if skipped, or per reason rows were left
    out."""
    t, why = _read_file(f, table)
    if t is None:
        return None, [(f, why)]
    t, times, size = _kept(t, table)
    return t, _notes(f, table, times, size)


def _say_pending(run: pathlib.Path, table: str, logs: list) -> None:
    """Rows not in Parquet yet: write-ahead logs of processes killed or still running."""
    if logs:
        n = len(logs)
        _warn(
            f"{run / table}: {n} write-ahead log{'s' if n > 1 else ''} pending (a process was killed or still "
            f"runs; {logs[0].name}{', ...' if n > 1 else ''}): their rows are not read; "
            f"`zcta recover {run}` turns them into Parquet"
        )


def _read(run: pathlib.Path, table: str) -> tuple[pa.Table | None, list, list]:
    """A table's usable files concatenated (None: none), less their damaged rows
    (`_kept`); the (path, reason) of each file skipped or with rows left out, and its
    pending logs; warns of each."""
    if table not in COLUMNS:
        raise ValueError(f"unknown table {table!r} (known: {', '.join(TABLES)})")
    listing = _list_files(run, table)
    skipped = list(listing.skipped)
    parts = []
    extra: dict[str, tuple[pa.DataType, pathlib.Path]] = {}
    for f in listing.parquet:
        t, sk = _read_usable(f, table)
        skipped += sk
        if t is None:
            continue
        # A column zcta does not know (written by a newer one) is kept; where files
        # disagree on its type, the first file's type stands and the others' are left out.
        for name in t.column_names[len(COLUMNS[table]):]:
            ty = t.schema.field(name).type
            first = extra.setdefault(name, (ty, f))
            if first[0] != ty:
                _warn(f"{f}: column {name} has type {ty}, not {first[0]} as in {first[1]}: left out of this file's rows")
                t = t.drop_columns([name])
        parts.append(t)
    for p, why in skipped:
        _warn(f"skipped {p}: {why}")
    _say_pending(run, table, listing.logs)
    if not parts:
        return None, skipped, listing.logs
    return pa.concat_tables(parts, promote_options="default"), skipped, listing.logs


def read_table(run_dir, table: str) -> pd.DataFrame:
    """One table of a run as a DataFrame (empty when the run has none). Files written
    with older schema versions read with the columns they lack as NULL; files that
    cannot be used are skipped with a warning naming them (see the module's help).
    Rows of `ops`, `gpu` and `proxy` with a time outside 1970..2116, and ops rows of a
    call that succeeded with bytes of 2^62 or more, are left out, as zcta leaves them
    out of its figures, each file with such rows named with a warning and their count.
    Integer columns are nullable integer dtypes (`Int64`, `UInt64`, ...): exact;
    boolean columns pandas' `boolean` (NULL as `pd.NA`)."""
    t, _, _ = _read(pathlib.Path(run_dir), table)
    return pd.DataFrame() if t is None else _to_pandas(t)


@dataclass
class Run:
    """The tables of one run directory; `skipped`: (path, reason) of each file or
    directory of those tables that was not read, and of each file of which rows were
    left out (a time outside 1970..2116, a successful call's impossible bytes: see the
    module's help), once per reason, as zcta lists them."""

    path: pathlib.Path
    ops: pd.DataFrame = field(default_factory=pd.DataFrame)
    gpu: pd.DataFrame = field(default_factory=pd.DataFrame)
    proxy: pd.DataFrame = field(default_factory=pd.DataFrame)
    comms: pd.DataFrame = field(default_factory=pd.DataFrame)
    process: pd.DataFrame = field(default_factory=pd.DataFrame)
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)
    skipped: list = field(default_factory=list)


def _check_run(run: pathlib.Path) -> None:
    try:
        st = os.stat(run)
    except FileNotFoundError:
        raise FileNotFoundError(f"{run}: no such run directory") from None
    except OSError as e:
        raise OSError(f"{run}: {_why(e)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{run}: not a directory")


def load(run_dir) -> Run:
    """Reads a run directory (see `Run`): rows, integer and boolean columns as in
    `read_table` (rows with a time out of range or impossible bytes left out, their
    files named)."""
    run = pathlib.Path(run_dir)
    _check_run(run)
    dfs, skipped = [], []
    for t in ("ops", "gpu", "proxy", "comms", "process", "phases"):
        tbl, sk, _ = _read(run, t)
        dfs.append(pd.DataFrame() if tbl is None else _to_pandas(tbl))
        skipped += sk
    return Run(run, *dfs, skipped=skipped)


def _duckdb_path(p: pathlib.Path) -> str | None:
    """The path as DuckDB's read_parquet takes it, or None where it cannot: a name that
    is not UTF-8, or one with a glob character (DuckDB would expand `*`, `?`, `[`)."""
    s = str(p)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return None
    if any(c in s for c in "*?[]\\"):
        return None
    return "'" + s.replace("'", "''") + "'"


def connect(run_dir):
    """An in-process DuckDB connection with one view per table the run has, over the
    files `load` would read (a file it would skip is left out with the same warning;
    only footers are checked here: a file whose data turns out corrupt fails the query
    that reads it). A file DuckDB cannot open by name (not UTF-8, glob characters) is
    read into memory. The views of `ops`, `gpu` and `proxy` leave out the rows `load`
    leaves out (a time out of range; in `ops`, a successful call's impossible bytes),
    and each file with such rows is named with their count, per reason (counted where
    the footer's statistics do not rule them out)."""
    import duckdb

    run = pathlib.Path(run_dir)
    _check_run(run)
    con = duckdb.connect()
    for t in TABLES:
        listing = _list_files(run, t)
        skipped = list(listing.skipped)
        by_name, in_memory = [], []
        judged = set()  # the judged columns (_judged) some file of the table has
        for f in listing.parquet:
            q = _duckdb_path(f)
            if q is None:
                tbl, sk = _read_usable(f, t)
                skipped += sk
                if tbl is not None:
                    judged.update(_judged(t, tbl.column_names))
                    in_memory.append(tbl)
                continue
            have, clean = {}, True
            try:
                with _open(f) as fh:
                    try:
                        pf = pq.ParquetFile(fh)
                        why = _footer_problem(pf, t)
                        if not why:
                            have = _judged(t, pf.schema_arrow.names)
                            why, clean = _from_stats(pf, t, have)
                    except Exception as e:
                        why = f"not a readable Parquet file (truncated or corrupt?): {e}"
            except OSError as e:
                why = f"cannot open: {_why(e)}"
            if not why and not clean:
                times, size = _rules_sql(t, have)
                try:
                    n_times, n_size = con.execute(
                        f"select count(*) filter (where not ({times})), "
                        f"count(*) filter (where ({times}) and not ({size})) from read_parquet({q})"
                    ).fetchone()
                except Exception as e:  # duckdb.Error: the data is corrupt
                    why = f"corrupt data: {e}"
                else:
                    skipped += _notes(f, t, n_times, n_size)
            if why:
                skipped.append((f, why))
            else:
                judged.update(have)
                by_name.append(q)
        # By path alone: a file's notes stay in zcta's order (a time, then bytes).
        for p, why in sorted(skipped, key=lambda s: s[0]):
            _warn(f"skipped {p}: {why}")
        _say_pending(run, t, listing.logs)
        parts = []
        if by_name:
            parts.append(f"select * from read_parquet([{', '.join(by_name)}], union_by_name = true)")
        if in_memory:
            con.register(f"_zcta_{t}_in_memory", pa.concat_tables(in_memory, promote_options="default"))
            parts.append(f"select * from _zcta_{t}_in_memory")
        if parts:
            rows = " union all by name ".join(parts)
            if judged:  # the damaged rows left out
                times, size = _rules_sql(t, judged)
                rows = f"select * from ({rows}) where ({times}) and ({size})"
            con.execute(f"create view {t} as {rows}")
    return con


def _from_stats(pf: pq.ParquetFile, table: str, judged: dict) -> tuple[str | None, bool]:
    """What the footer's statistics say, in one walk of its column chunks: a required
    column of `table` that holds NULLs (why the file is skipped, or None), and whether
    every value of the `judged` columns (_judged; those with an end) lies in [0, end),
    so no row is left out (False: some value does not, or the statistics do not
    tell)."""
    required = {name for name, _, nullable in COLUMNS[table] if not nullable}
    ends = {name: end for name, end in judged.items() if end is not None}
    in_range = True
    md = pf.metadata
    for rg in range(md.num_row_groups):
        g = md.row_group(rg)
        for c in range(g.num_columns):
            col = g.column(c)
            name = col.path_in_schema
            st = col.statistics if col.is_stats_set else None
            if name in required and st is not None and st.has_null_count and st.null_count:
                return f"required column {name} holds NULLs", in_range
            if name not in ends or not in_range:
                continue
            if st is not None and st.has_min_max:
                in_range = 0 <= st.min and st.max < ends[name]
            elif not (st is not None and st.has_null_count and st.null_count == g.num_rows):
                in_range = False  # no min/max, and not all NULL
    return None, in_range


def size_bucket(b: pd.Series) -> pd.Series:
    """The report's size bucket of each `bytes`: the largest power of two ≤ bytes, 0 for
    bytes 0 or NULL (src/analysis/report.rs `size_bucket` of `bytes.unwrap_or(0)`), on
    the exact integers (UInt64; never through float64, which rounds 2^54 - 1 up to 2^54).
    Takes any integer column of values in [0, 2^64) (a float64 one gives the buckets of
    its values, as rounded when it was made: keep bytes exact, as `load` does); raises
    ValueError for another value."""
    import numpy as np

    v = _ints(b, "UInt64")
    try:
        with np.errstate(invalid="ignore"):  # a float beyond 2^64: the ValueError says it
            v = v.astype("UInt64")
    except (TypeError, ValueError, OverflowError):
        raise ValueError("size_bucket: bytes must be integers in [0, 2^64) or NULL") from None
    x = v.fillna(0).to_numpy("uint64", copy=True)
    for shift in (1, 2, 4, 8, 16, 32):  # every bit below the highest set
        x |= x >> np.uint64(shift)
    return pd.Series(x - (x >> np.uint64(1)), index=b.index, dtype="UInt64")


def _ints(s: pd.Series, dtype: str = "Int64") -> pd.Series:
    """A column of integers and NULLs that pandas holds as objects (a column assigned
    None, rows built by hand) as exact nullable integers (`dtype`); any other column as
    it is."""
    if s.dtype != object:
        return s
    try:
        return s.astype(dtype)
    except (TypeError, ValueError):  # not integers: left to pandas as they are
        return s


def _stream_start(ops: pd.DataFrame) -> pd.Series:
    """When each op could start on its stream: `gpu_ready_ns`, or NCCL's `launch_ns`
    where that is later; NULL where `gpu_ready_ns` is. Elementwise on the columns'
    own (integer) values: never through float64."""
    ready = _ints(ops.gpu_ready_ns)
    if "launch_ns" not in ops:
        return ready
    launch = _ints(ops.launch_ns)
    later = (launch > ready).fillna(False).astype(bool)  # NULL on either side: ready stands
    return ready.mask(later, launch)


def stream_time_ns(ops: pd.DataFrame) -> pd.Series:
    """Each op's time on its stream (docs/phases.md), ns: from when the stream was free
    for it, or NCCL's launch if later (when known), to its GPU end — for an op timed
    with CUDA events, their elapsed time. NaN where `gpu_ready_ns` is unknown (not
    timed, or files from before it existed). float64, subtracted on the exact integer
    times first (a duration is exact in float64; a time since the epoch is not). NaN
    too for a row with a time outside 1970..2116, or a successful call's with bytes of
    2^62 or more, as zcta leaves it out (with a warning; `load` and `read_table` have
    left such rows out already). The frame should hold exact integers (read with this
    package, or `pd.read_parquet(..., dtype_backend="numpy_nullable")` or `"pyarrow"`):
    in float64, bytes of 2^62 - 1 round to 2^62 and the row is left out."""
    nan = pd.Series(float("nan"), index=ops.index)
    if "gpu_ready_ns" not in ops:
        return nan
    keep = _ops_kept(ops, "stream_time_ns")
    if not keep.all():  # computed on the others only: no overflow
        out = nan.copy()
        out[keep.to_numpy()] = stream_time_ns(ops[keep]).to_numpy()
        return out
    known = (ops.gpu_ready_ns.notna() & ops.gpu_end_ns.notna()).astype(bool)
    if not known.any():
        return nan
    dur = _ints(ops.gpu_end_ns) - _stream_start(ops)
    return dur.where(known).astype("float64")


def _all_phases(ph: pd.DataFrame) -> pd.DataFrame:
    """A copy with every phase column; a `phases` table written by an older zcta lacks
    the newer ones (`sync_ns`): not measured there."""
    ph = ph.copy()
    for p in PHASES:
        if f"{p}_ns" not in ph:
            ph[f"{p}_ns"] = pd.Series(pd.NA, index=ph.index, dtype="Int64")
    return ph


def weights(run: Run, ph: pd.DataFrame) -> pd.Series:
    """How many ops each `phases` row stands for, as in `zcta report`: for an op the
    budget timed with GPU stamps, its stratum's ops (one process, timing_level, op and
    size bucket) that the budget drew from (timed, or not timed by the budget: `timing`
    budget, with its level) over those it timed, in steps
    of 1/1024 as `zcta report` rounds it (the hash picks 1 op in 2^level, and the rate
    limiter skips some of those in a burst, so 2^level alone would misstate it); 1
    otherwise (deep mode's ops, and files from before the budget)."""
    ops = run.ops
    one = pd.Series(1.0, index=ph.index, dtype="float64")
    if ops.empty or not {"timing", "timing_level", "gpu_source"} <= set(ops.columns):
        return one
    key = ["host", "pid", "op_id"]
    o = ops[key + ["op", "bytes", "timing", "timing_level", "gpu_source"]].drop_duplicates(key).reset_index(drop=True)
    # "events": files written before GPU stamps replaced CUDA events. Plain bools: a
    # comparison with a NULL string or integer gives pd.NA in pandas' nullable dtypes.
    leveled = o.timing_level.notna().to_numpy(dtype=bool)
    timed = ((o.timing == "timed") & o.gpu_source.isin(["stamps", "events"])).fillna(False).to_numpy(dtype=bool) & leveled
    drawn = timed | ((o.timing == "budget").fillna(False).to_numpy(dtype=bool) & leveled)
    strata = pd.DataFrame({
        "host": o.host, "pid": o.pid, "level": o.timing_level, "op": o.op, "size": size_bucket(o.bytes),
        "drawn": drawn.astype("int64"), "timed": timed.astype("int64"),
    })
    cols = ["host", "pid", "level", "op", "size"]
    per = strata[drawn].groupby(cols, dropna=False)[["drawn", "timed"]].sum()
    # Halves rounded up, as Rust's f64::round does (pandas' round goes to even).
    w = (((per.drawn * 1024 / per.timed.clip(lower=1) + 0.5) // 1).clip(lower=1024) / 1024).rename("w")
    o["w"] = strata[cols].join(w, on=cols)["w"].where(timed, 1.0).fillna(1.0).astype("float64")
    m = ph[key].merge(o[key + ["w"]], on=key, how="left")
    return pd.Series(m.w.fillna(1.0).to_numpy(dtype="float64"), index=ph.index, dtype="float64")


def _weighted_median(v: pd.Series, w: pd.Series) -> float:
    """The first value (ascending) whose weight, with the smaller ones', exceeds half the
    total, as `zcta report`'s p50 and `zcta diff`'s medians (of an even count of equal
    weights, the upper middle value); NaN without values. NULLs are left out."""
    keep = v.notna().to_numpy(dtype=bool)
    vals, ws = v.to_numpy(dtype="float64", na_value=float("nan"))[keep], w.to_numpy(dtype="float64")[keep]
    if not len(vals):
        return float("nan")
    order = vals.argsort(kind="stable")
    vs, cum = vals[order], ws[order].cumsum()
    return float(vs[(cum > cum[-1] / 2).argmax()])


def _report_op(op: pd.Series) -> pd.Series:
    """The op a report groups by: ncclBcast is ncclBroadcast in place (`ops.op` keeps
    the API name called)."""
    return op.where(op != "Bcast", "Broadcast")


def breakdown(run: Run | str) -> pd.DataFrame:
    """Per (op, size bucket, engine) (`size`: the report's bucket, `size_bucket`, UInt64;
    0 for bytes 0 or NULL): the ops they stand for (`count`: a timed op counts for its
    budget stratum's ops, `weights`, as in `zcta report`; `rows`: the rows), the weighted
    median end-to-end time (µs) and each phase's weighted share of the summed window
    (NaN: not measured), from the `phases` table joined to `ops`. As in `zcta report`,
    no op with a time outside 1970..2116, or a successful call's bytes of 2^62 or more,
    counts: `zcta phases` wrote no row for it, and `load` leaves it out of `ops`, naming
    its file."""
    if not isinstance(run, Run):
        run = load(run)
    ph = run.phases
    if ph.empty:
        raise ValueError(f"{run.path}: no phases table (RUN/phases/): run `zcta phases {run.path}` first")
    ph = _all_phases(ph[ph.window_ns.notna()])
    ph["w"] = weights(run, ph)
    ph["size"] = size_bucket(ph["bytes"])
    ph["op"] = _report_op(ph["op"])
    # A timed op whose path NCCL did not name is "unknown", as in `zcta report`.
    ph["engine"] = ph["engine"].fillna("unknown")
    rows = []
    columns = ["op", "size", "engine", "count", "rows", "p50_us", *PHASES]
    for (op, size, engine), g in ph.groupby(["op", "size", "engine"]):
        total = (g.window_ns * g.w).sum()
        row = {
            "op": op,
            "size": size,
            "engine": engine,
            "count": int(round(g.w.sum())),
            "rows": len(g),
            "p50_us": _weighted_median(g.window_ns.astype("float64"), g.w) / 1e3,
        }
        for p in PHASES:
            col = g[f"{p}_ns"]
            row[p] = (col.astype("float64") * g.w).sum() / total if col.notna().any() and total > 0 else float("nan")
        rows.append(row)
    out = pd.DataFrame(rows, columns=columns)
    out["size"] = out["size"].astype("UInt64")
    return out


def compare(run_a, run_b) -> pd.DataFrame:
    """Per (op, size) (`size`: the report's bucket, `size_bucket`, as in `zcta diff`;
    Bcast with Broadcast): the median window and phases in A and B, each timed op
    weighted by the ops it stands for (`weights`), and the change (µs), from
    each run's `phases` table (`zcta phases`: no row for an op with a time outside
    1970..2116 or a successful call's bytes of 2^62 or more, as in `zcta diff`); a run
    given as a path is read with `load`, which names each file with such rows."""
    a, b = (r if isinstance(r, Run) else load(r) for r in (run_a, run_b))
    out = []
    for name, r in (("a", a), ("b", b)):
        if r.phases.empty:
            raise ValueError(f"{r.path}: no phases table (RUN/phases/): run `zcta phases {r.path}` first")
        ph = _all_phases(r.phases[r.phases.window_ns.notna()])
        ph["size"] = size_bucket(ph["bytes"])
        ph["op"] = _report_op(ph["op"])
        ph["w"] = weights(r, ph)
        cols = ["window_ns"] + [f"{p}_ns" for p in PHASES]
        # Weighted as `zcta diff` weights them; NaN: not measured.
        rows = {k: {c: _weighted_median(g[c], g["w"]) for c in cols} for k, g in ph.groupby(["op", "size"])}
        m = pd.DataFrame.from_dict(rows, orient="index", columns=cols).astype("float64") / 1e3
        m.index = pd.MultiIndex.from_tuples(list(rows), names=["op", "size"]) if rows else pd.MultiIndex.from_tuples([], names=["op", "size"])
        m.columns = [f"{c[:-3]}_{name}_us" for c in cols]
        out.append(m)
    j = out[0].join(out[1], how="inner")
    for c in ["window"] + list(PHASES):
        j[f"{c}_change_us"] = j[f"{c}_b_us"] - j[f"{c}_a_us"]
    return j.reset_index().sort_values("window_change_us", key=abs, ascending=False)
