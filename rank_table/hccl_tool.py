"""Generate, merge, validate and inspect Ascend HCCL rank tables (schema 1.0; schema 1.2 is read too).

A rank table tells HCCL which devices of which servers take part in a job and which rank each one is::

    {"version": "1.0", "server_count": "2", "status": "completed",
     "server_list": [{"server_id": "10.155.111.140", "host_nic_ip": "reserve",
                      "device": [{"device_id": "0", "device_ip": "192.1.27.6", "rank_id": "0"}, ...]}, ...]}

Rules checked by ``validate`` (each failure names the field, e.g. ``server_list[1].device[3].rank_id``):
``rank_id`` values are unique and exactly ``0..n-1``; ``device_id`` is unique within a server; device
IPs are unique IPv4 addresses; schema 1.0 ``server_id`` is an IPv4 address (1.2: any unique name);
``server_count`` equals the number of servers; ``status`` is ``completed``; schema 1.2's optional
``super_pod_list`` names only listed servers, each at most once. Numbers (ids, ports, IP octets) are ASCII
digits only (``"٠"`` is not a rank id). Files: a key given twice in one JSON object, invalid UTF-8, nesting
deeper than a rank table needs, an output path naming a folder are errors naming the file; outputs are
written to a temporary file renamed into place, removed on any failure.

Command line::

    python rank_table/hccl_tool.py generate --server_ip 10.0.0.1 --device_ips 0:192.1.27.6,1:192.2.27.6 -o t.json
    python rank_table/hccl_tool.py generate --server_ip 10.0.0.1 --hccn_conf /etc/hccn.conf --visible_devices 0-7
    python rank_table/hccl_tool.py merge server0.json server1.json -o rank_table_16pcs.json
    python rank_table/hccl_tool.py validate rank_table_16pcs.json
    python rank_table/hccl_tool.py info rank_table_16pcs.json
    python rank_table/hccl_tool.py devices rank_table_16pcs.json --server_index 1   # "device_id rank_id device_ip"
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "RankTableError", "Device", "Server", "RankTable", "SUPPORTED_VERSIONS", "validate", "load", "parse_device_ips",
    "parse_hccn_conf", "parse_visible_devices", "generate", "merge", "write", "main",
]

SUPPORTED_VERSIONS = ("1.0", "1.2")
MAX_DEVICE_ID = 63
MAX_DEPTH = 8  # a rank table nests 5 levels deep (table, super_pod_list, pod, server_list, server)
_DIGITS = re.compile(r"[0-9]{1,18}")  # ASCII digits only (str.isdigit and \d accept other scripts' digits)
_IPV4 = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")


class RankTableError(ValueError):
    """A rank table (or an argument building one) is malformed; the message names the field."""


@dataclass(frozen=True)
class Device:
    """One device of a server: ``device_id`` on its server, global ``rank_id``, ``device_ip``."""

    device_id: int
    rank_id: int
    device_ip: Optional[str]


@dataclass(frozen=True)
class Server:
    """One server: its ``server_id`` and devices in table order."""

    server_id: str
    devices: Tuple[Device, ...]


@dataclass(frozen=True)
class RankTable:
    """A validated rank table."""

    version: str
    servers: Tuple[Server, ...]

    @property
    def rank_size(self) -> int:
        """Total number of ranks (devices over all servers)."""
        return sum(len(server.devices) for server in self.servers)

    def server(self, index: int) -> Server:
        """The ``index``-th server (0-based, table order); ``RankTableError`` when out of range."""
        if not 0 <= index < len(self.servers):
            raise RankTableError(f"server_index={index} is out of range: the table has {len(self.servers)} "
                                 f"server(s) (0..{len(self.servers) - 1}).")
        return self.servers[index]


# ------------------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------------------
def _int_field(where: str, value: Any, low: int = 0, high: Optional[int] = None) -> int:
    """Rank tables store integers as decimal strings (HCCL reads strings); a JSON number is refused."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise RankTableError(f"{where}={value!r} is a JSON number; the HCCL rank table format needs a string: "
                             f"write \"{value}\".")
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        number = int(value)
    else:
        raise RankTableError(f"{where}={value!r} must be a decimal integer string of ASCII digits 0-9 such as "
                             f"\"0\".")
    if number < low or (high is not None and number > high):
        raise RankTableError(f"{where}={value!r} must be in [{low}, {high if high is not None else 'inf'}].")
    return number


def _ipv4_field(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise RankTableError(f"{where}={value!r} must be an IPv4 address string.")
    if not _IPV4.fullmatch(value):
        raise RankTableError(f"{where}={value!r} is not an IPv4 address (four dot-separated ASCII decimal numbers).")
    try:
        ipaddress.IPv4Address(value)
    except ipaddress.AddressValueError:
        raise RankTableError(f"{where}={value!r} is not an IPv4 address.") from None
    return value


def _mapping(where: str, value: Any) -> Mapping:
    if not isinstance(value, Mapping):
        raise RankTableError(f"{where} must be a JSON object, got {type(value).__name__}.")
    return value


def _required(where: str, data: Mapping, key: str) -> Any:
    if key not in data:
        raise RankTableError(f"{where}.{key} is missing." if where else f"{key} is missing.")
    return data[key]


def validate(table: Any) -> RankTable:
    """Check a parsed rank table against the rules above.

    Returns:
        the :class:`RankTable`.

    Raises:
        RankTableError: the first violated rule, naming the field and the value.
    """
    table = _mapping("rank table", table)
    version = _required("", table, "version")
    if not isinstance(version, str):
        raise RankTableError(f"version={version!r} must be a JSON string such as \"{SUPPORTED_VERSIONS[0]}\" "
                             f"(supported: {', '.join(SUPPORTED_VERSIONS)}), not a {type(version).__name__}.")
    if version not in SUPPORTED_VERSIONS:
        raise RankTableError(f"version={version!r} is not supported; supported: {', '.join(SUPPORTED_VERSIONS)}.")
    status = _required("", table, "status")
    if status != "completed":
        raise RankTableError(f"status={status!r} must be \"completed\".")
    server_list = _required("", table, "server_list")
    if not isinstance(server_list, list) or not server_list:
        raise RankTableError("server_list must be a non-empty list of servers.")
    server_count = _int_field("server_count", _required("", table, "server_count"), low=1)
    if server_count != len(server_list):
        raise RankTableError(f"server_count={table['server_count']!r} does not match the {len(server_list)} "
                             f"server(s) in server_list.")
    servers: List[Server] = []
    seen_servers: Dict[str, str] = {}
    seen_ranks: Dict[int, str] = {}
    seen_ips: Dict[str, str] = {}
    for s_index, raw_server in enumerate(server_list):
        where = f"server_list[{s_index}]"
        raw_server = _mapping(where, raw_server)
        server_id = _required(where, raw_server, "server_id")
        if version == "1.0":
            _ipv4_field(f"{where}.server_id", server_id)
        elif not isinstance(server_id, str) or not server_id.strip():
            raise RankTableError(f"{where}.server_id={server_id!r} must be a non-empty string.")
        if server_id in seen_servers:
            raise RankTableError(f"{where}.server_id={server_id!r} duplicates {seen_servers[server_id]}.server_id.")
        seen_servers[server_id] = where
        for key in ("container_ip", "host_ip"):
            if key in raw_server:
                _ipv4_field(f"{where}.{key}", raw_server[key])
        nic = raw_server.get("host_nic_ip", "reserve")
        if nic != "reserve":
            _ipv4_field(f"{where}.host_nic_ip", nic)
        raw_devices = _required(where, raw_server, "device")
        if not isinstance(raw_devices, list) or not raw_devices:
            raise RankTableError(f"{where}.device must be a non-empty list of devices.")
        devices: List[Device] = []
        seen_device_ids: Dict[int, str] = {}
        for d_index, raw_device in enumerate(raw_devices):
            d_where = f"{where}.device[{d_index}]"
            raw_device = _mapping(d_where, raw_device)
            device_id = _int_field(f"{d_where}.device_id", _required(d_where, raw_device, "device_id"),
                                   high=MAX_DEVICE_ID)
            if device_id in seen_device_ids:
                raise RankTableError(f"{d_where}.device_id={raw_device['device_id']!r} duplicates "
                                     f"{seen_device_ids[device_id]}.device_id on server {server_id!r}.")
            seen_device_ids[device_id] = d_where
            rank_id = _int_field(f"{d_where}.rank_id", _required(d_where, raw_device, "rank_id"))
            if rank_id in seen_ranks:
                raise RankTableError(f"{d_where}.rank_id={raw_device['rank_id']!r} duplicates "
                                     f"{seen_ranks[rank_id]}.rank_id.")
            seen_ranks[rank_id] = d_where
            device_ip = raw_device.get("device_ip")
            if version == "1.0" or device_ip is not None:
                device_ip = _ipv4_field(f"{d_where}.device_ip", _required(d_where, raw_device, "device_ip"))
                if device_ip in seen_ips:
                    raise RankTableError(f"{d_where}.device_ip={device_ip!r} duplicates "
                                         f"{seen_ips[device_ip]}.device_ip.")
                seen_ips[device_ip] = d_where
            if "super_device_id" in raw_device:
                _int_field(f"{d_where}.super_device_id", raw_device["super_device_id"])
            devices.append(Device(device_id, rank_id, device_ip))
        servers.append(Server(server_id, tuple(devices)))
    rank_size = len(seen_ranks)
    missing = sorted(set(range(rank_size)) - set(seen_ranks))
    if missing:
        extra = sorted(r for r in seen_ranks if r >= rank_size)
        raise RankTableError(f"rank_id values must be exactly 0..{rank_size - 1}; missing {missing}, "
                             f"out of range {extra} (at {', '.join(seen_ranks[r] for r in extra)}).")
    if "super_pod_list" in table:
        _validate_super_pods(table["super_pod_list"], seen_servers)
    return RankTable(version, tuple(servers))


def _validate_super_pods(pods: Any, servers: Mapping[str, str]) -> None:
    if not isinstance(pods, list):
        raise RankTableError("super_pod_list must be a list.")
    placed: Dict[str, str] = {}
    for p_index, pod in enumerate(pods):
        where = f"super_pod_list[{p_index}]"
        pod = _mapping(where, pod)
        _int_field(f"{where}.super_pod_id", _required(where, pod, "super_pod_id"))
        members = _required(where, pod, "server_list")
        if not isinstance(members, list):
            raise RankTableError(f"{where}.server_list must be a list.")
        for m_index, member in enumerate(members):
            m_where = f"{where}.server_list[{m_index}]"
            server_id = _required(m_where, _mapping(m_where, member), "server_id")
            if server_id not in servers:
                raise RankTableError(f"{m_where}.server_id={server_id!r} is not a server of server_list.")
            if server_id in placed:
                raise RankTableError(f"{m_where}.server_id={server_id!r} is already in {placed[server_id]}.")
            placed[server_id] = m_where


def _read_text(path: Path, what: str = "rank tables are UTF-8 JSON") -> str:
    """The file's text; ``RankTableError`` naming the file on an unreadable file or invalid UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RankTableError(f"{path}: cannot read ({exc.strerror or exc}).") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RankTableError(f"{path}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                             f"{what}.") from None


def _no_duplicate_keys(pairs: List[Tuple[str, Any]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise RankTableError(f"key {key!r} is given twice in one JSON object (values {result[key]!r:.60} and "
                                 f"{value!r:.60}); each key may appear once.")
        result[key] = value
    return result


def _depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` in a JSON text, outside strings (a linear scan, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _parse_json(path: Path, text: str) -> Any:
    """Parse a rank table's JSON text: duplicate keys and deep nesting are errors naming the file."""
    depth = _depth(text)
    if depth > MAX_DEPTH:
        raise RankTableError(f"{path}: JSON nested {depth} levels deep; a rank table nests at most {MAX_DEPTH}.")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise RankTableError(f"{path}: not valid JSON ({exc}).") from None
    except RankTableError as exc:
        raise RankTableError(f"{path}: {exc}") from None
    except RecursionError:  # pragma: no cover - guarded by the depth check above
        raise RankTableError(f"{path}: JSON nested too deeply for a rank table.") from None


def load(path: Union[str, Path]) -> Tuple[dict, RankTable]:
    """Read and validate a rank table file; returns ``(raw dict, RankTable)``.

    Raises:
        RankTableError: missing file, invalid JSON, or an invalid table (the message starts with the path).
    """
    path = Path(path)
    if not path.is_file():
        raise RankTableError(f"{path}: no such rank table file.")
    raw = _parse_json(path, _read_text(path))
    try:
        return raw, validate(raw)
    except RankTableError as exc:
        raise RankTableError(f"{path}: {exc}") from None


# ------------------------------------------------------------------------------------------------------------
# generation and merging
# ------------------------------------------------------------------------------------------------------------
def parse_visible_devices(text: str) -> List[int]:
    """``"0-7"`` or ``"0,1,4"`` (or a mix, ``"0-3,6"``) -> sorted unique device ids."""
    ids: List[int] = []
    for part in str(text).split(","):
        part = part.strip()
        match = re.fullmatch(r"([0-9]{1,9})(?:-([0-9]{1,9}))?", part)
        if not match:
            raise RankTableError(f"visible_devices={text!r}: {part!r} is not a device id or a range like 0-7.")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high > MAX_DEVICE_ID:
            raise RankTableError(f"visible_devices={text!r}: range {part!r} must be increasing within "
                                 f"0..{MAX_DEVICE_ID}.")
        ids.extend(range(low, high + 1))
    if len(set(ids)) != len(ids):
        raise RankTableError(f"visible_devices={text!r} lists a device twice.")
    return sorted(ids)


def parse_device_ips(text: str) -> Dict[int, str]:
    """``"0:192.1.27.6,1:192.2.27.6"`` -> ``{0: "192.1.27.6", 1: "192.2.27.6"}``."""
    result: Dict[int, str] = {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if ":" not in part:
            raise RankTableError(f"device_ips entry {part!r} must be DEVICE_ID:IP, e.g. 0:192.1.27.6.")
        device, address = part.split(":", 1)
        device_id = _int_field(f"device_ips[{device!r}] device id", device.strip(), high=MAX_DEVICE_ID)
        if device_id in result:
            raise RankTableError(f"device_ips lists device {device_id} twice.")
        result[device_id] = _ipv4_field(f"device_ips[{device_id}]", address.strip())
    if not result:
        raise RankTableError("device_ips is empty; expected DEVICE_ID:IP pairs separated by commas.")
    return result


def parse_hccn_conf(text: str) -> Dict[int, str]:
    """Device IPs from an ``/etc/hccn.conf`` text (lines ``address_<device_id>=<ipv4>``; others ignored)."""
    result: Dict[int, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = re.fullmatch(r"\s*address_([0-9]+)\s*=\s*(\S+)\s*", line)
        if not match:
            if line.strip().startswith("address_"):
                raise RankTableError(f"hccn.conf line {number}: {line.strip()[:80]!r} is not "
                                     f"'address_<device_id>=<ipv4>' with ASCII digits.")
            continue
        device_id = _int_field(f"hccn.conf line {number} device id", match.group(1), high=MAX_DEVICE_ID)
        if device_id in result:
            raise RankTableError(f"hccn.conf line {number}: address_{device_id} is given twice.")
        result[device_id] = _ipv4_field(f"hccn.conf line {number} address_{device_id}", match.group(2))
    if not result:
        raise RankTableError("hccn.conf holds no 'address_<device_id>=<ip>' line.")
    return result


def generate(server_ip: str, device_ips: Mapping[int, str], visible_devices: Optional[Sequence[int]] = None,
             rank_offset: int = 0) -> dict:
    """A one-server schema 1.0 rank table.

    Args:
        server_ip: the server's IPv4 address (``server_id``).
        device_ips: device id -> device IPv4 (from ``--device_ips`` or ``hccn.conf``).
        visible_devices: devices to include (all of ``device_ips`` when None), in increasing order.
        rank_offset: ``rank_id`` of the first device (for tables merged later, leave 0: merge renumbers).

    Raises:
        RankTableError: a visible device without an IP, or a resulting table that does not validate.
    """
    _ipv4_field("server_ip", server_ip)
    chosen = sorted(device_ips) if visible_devices is None else list(visible_devices)
    unknown = [d for d in chosen if d not in device_ips]
    if unknown:
        raise RankTableError(f"visible device(s) {unknown} have no IP (known: {sorted(device_ips)}).")
    devices = [{"device_id": str(d), "device_ip": device_ips[d], "rank_id": str(rank_offset + i)}
               for i, d in enumerate(chosen)]
    table = {"version": "1.0", "server_count": "1",
             "server_list": [{"server_id": server_ip, "device": devices, "host_nic_ip": "reserve"}],
             "status": "completed"}
    if rank_offset == 0:
        validate(table)
    return table


def _renumbered(server_list: Sequence[Mapping], first_rank: int = 0) -> List[dict]:
    """A copy of ``server_list`` whose ``rank_id`` values count up from ``first_rank`` in server, device order."""
    servers = json.loads(json.dumps(list(server_list)))
    rank = first_rank
    for server in servers:
        for device in server.get("device", []) if isinstance(server, dict) else []:
            if isinstance(device, dict):
                device["rank_id"] = str(rank)
                rank += 1
    return servers


def merge(tables: Sequence[Mapping], names: Optional[Sequence[str]] = None) -> dict:
    """Concatenate the servers of several tables into one, renumbering ``rank_id`` 0..n-1 in server order.

    The inputs' own ``rank_id`` values are ignored (each may count from 0, or be a slice of a larger
    table); everything else of each input must validate. The result keeps each input's device order,
    takes the highest input version, and is validated (so a server present twice is an error).

    ``names`` (e.g. the file names) name the inputs in errors; without them, ``input <position>``.

    Raises:
        RankTableError: an invalid input, a server present twice (each named by its input and its position
            there), or no input.
    """
    if not tables:
        raise RankTableError("merge needs at least one rank table.")
    names = [f"input {i}" for i in range(len(tables))] if names is None else [str(n) for n in names]
    servers: List[dict] = []
    origin: List[str] = []  # merged server index -> "server_list[k] of <input>"
    versions = []
    for index, table in enumerate(tables):
        try:
            table = _mapping("rank table", table)
            validate({**table, "server_list": _renumbered(_required("", table, "server_list"))})
        except RankTableError as exc:
            raise RankTableError(f"{names[index]}: {exc}") from None
        versions.append(table["version"])
        servers.extend(table["server_list"])
        origin.extend(f"{names[index]}: server_list[{k}]" for k in range(len(table["server_list"])))
    merged = {"version": max(versions, key=lambda v: tuple(int(p) for p in v.split("."))),
              "server_count": str(len(servers)), "server_list": _renumbered(servers), "status": "completed"}
    try:
        validate(merged)
    except RankTableError as exc:  # positions in the merged list -> the input they come from
        raise RankTableError(re.sub(r"server_list\[(\d+)\]", lambda m: f"({origin[int(m.group(1))]})", str(exc))) \
            from None
    return merged


def write(table: Mapping, path: Union[str, Path]) -> Path:
    """Write ``table`` as indented JSON, atomically (temporary file renamed into place).

    Raises:
        RankTableError: ``path`` names a folder, or the file cannot be written (the message names the path);
            the temporary file is removed on any failure.
    """
    path = Path(path)
    if path.is_dir():
        raise RankTableError(f"output {str(path)!r} is a folder; give a file name such as "
                             f"{str(path / 'rank_table.json')!r}.")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(table, out, indent=4)
            out.write("\n")
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise RankTableError(f"output {str(path)!r}: cannot write ({exc.strerror or exc}).") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


# ------------------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------------------
def _cmd_generate(args) -> int:
    if bool(args.device_ips) == bool(args.hccn_conf):
        raise RankTableError("give exactly one of --device_ips and --hccn_conf.")
    if args.device_ips:
        ips = parse_device_ips(args.device_ips)
    else:
        conf = Path(args.hccn_conf)
        if not conf.is_file():
            raise RankTableError(f"--hccn_conf {conf}: no such file.")
        ips = parse_hccn_conf(_read_text(conf, "hccn.conf must be UTF-8 (or ASCII) text"))
    visible = parse_visible_devices(args.visible_devices) if args.visible_devices else None
    table = generate(args.server_ip, ips, visible)
    output = args.output or f"hccl_{len(table['server_list'][0]['device'])}p_{args.server_ip}.json"
    print(f"wrote {write(table, output)}")
    return 0


def _cmd_merge(args) -> int:
    tables = []
    for name in args.inputs:
        raw, _ = load(name)
        tables.append(raw)
    merged = merge(tables, names=args.inputs)
    print(f"wrote {write(merged, args.output)} ({len(merged['server_list'])} servers, "
          f"{sum(len(s['device']) for s in merged['server_list'])} ranks)")
    return 0


def _cmd_validate(args) -> int:
    for name in args.files:
        _, table = load(name)
        print(f"{name}: OK (version {table.version}, {len(table.servers)} server(s), {table.rank_size} ranks)")
    return 0


def _cmd_info(args) -> int:
    _, table = load(args.file)
    print(f"version {table.version}\nservers {len(table.servers)}\nrank_size {table.rank_size}")
    for index, server in enumerate(table.servers):
        ranks = [d.rank_id for d in server.devices]
        print(f"server {index} {server.server_id} devices {len(server.devices)} ranks {min(ranks)}..{max(ranks)}")
    return 0


def _cmd_devices(args) -> int:
    _, table = load(args.file)
    for device in table.server(args.server_index).devices:
        print(f"{device.device_id} {device.rank_id} {device.device_ip or '-'}")
    return 0


def _ascii_index(text: str) -> int:
    """argparse type: a non-negative integer of ASCII digits (``int()`` would take ``"٠"``)."""
    if not _DIGITS.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer of ASCII digits 0-9")
    return int(text)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry; returns the exit status (2 with a message on any rank-table error)."""
    parser = argparse.ArgumentParser(prog="hccl_tool.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="one server's table from device IPs or hccn.conf")
    gen.add_argument("--server_ip", required=True, help="this server's IPv4 address")
    gen.add_argument("--device_ips", default="", help="DEVICE_ID:IP pairs, comma separated")
    gen.add_argument("--hccn_conf", default="", help="hccn.conf to read address_<id>=<ip> lines from")
    gen.add_argument("--visible_devices", default="", help="devices to include, e.g. 0-7 or 0,1,2,3")
    gen.add_argument("-o", "--output", default="", help="output file (default hccl_<n>p_<server_ip>.json)")
    gen.set_defaults(func=_cmd_generate)
    mrg = sub.add_parser("merge", help="join tables of several servers, renumbering rank_id")
    mrg.add_argument("inputs", nargs="+")
    mrg.add_argument("-o", "--output", required=True)
    mrg.set_defaults(func=_cmd_merge)
    val = sub.add_parser("validate", help="check tables; exit status 2 on the first error")
    val.add_argument("files", nargs="+")
    val.set_defaults(func=_cmd_validate)
    inf = sub.add_parser("info", help="summary: version, servers, rank size")
    inf.add_argument("file")
    inf.set_defaults(func=_cmd_info)
    dev = sub.add_parser("devices", help="'device_id rank_id device_ip' lines of one server (for launchers)")
    dev.add_argument("file")
    dev.add_argument("--server_index", type=_ascii_index, default=0, help="0-based position in server_list")
    dev.set_defaults(func=_cmd_devices)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except RankTableError as exc:
        print(f"hccl_tool.py {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
