"""HCCL rank-table tool: the shipped examples, generate (device IPs / hccn.conf), merge, validate, CLI errors."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rank_table.hccl_tool import (
    RankTableError,
    generate,
    load,
    main,
    merge,
    parse_device_ips,
    parse_hccn_conf,
    parse_visible_devices,
    validate,
)

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "rank_table" / "hccl_tool.py"
TABLE_16 = ROOT / "rank_table" / "rank_table_16pcs.json"
TABLE_8 = ROOT / "rank_table" / "rank_table_8pcs.json"


def table_16() -> dict:
    return json.loads(TABLE_16.read_text())


def test_shipped_examples_match_the_tutorial_tables():
    raw8, t8 = load(TABLE_8)
    raw16, t16 = load(TABLE_16)
    assert (t8.version, len(t8.servers), t8.rank_size) == ("1.0", 1, 8)
    assert (t16.version, len(t16.servers), t16.rank_size) == ("1.0", 2, 16)
    assert [s.server_id for s in t16.servers] == ["10.155.111.140", "10.155.111.141"]
    # rank r lives on server r // 8 as device r % 8; device IPs as in the AdaSum tutorial
    for server_index, server in enumerate(t16.servers):
        for device in server.devices:
            assert device.rank_id == 8 * server_index + device.device_id
    assert t16.servers[1].devices[0].device_ip == "192.1.27.8" and t16.servers[0].devices[7].device_ip == "192.4.27.7"
    assert raw8["server_list"] == raw16["server_list"][:1]
    assert raw16["server_count"] == "2" and raw16["status"] == "completed"
    assert all(isinstance(d["rank_id"], str) for s in raw16["server_list"] for d in s["device"])


def _set(table: dict, path: tuple, value) -> dict:
    table = copy.deepcopy(table)
    node = table
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return table


_DELETE = object()
MALFORMED = [
    ("duplicate rank_id", ("server_list", 1, "device", 3, "rank_id"), "2",
     r"server_list\[1\]\.device\[3\]\.rank_id='2' duplicates server_list\[0\]\.device\[2\]\.rank_id"),
    ("rank ids not 0..n-1", ("server_list", 1, "device", 7, "rank_id"), "16",
     r"rank_id values must be exactly 0\.\.15; missing \[15\], out of range \[16\] "
     r"\(at server_list\[1\]\.device\[7\]\)"),
    ("duplicate device_id on a server", ("server_list", 0, "device", 1, "device_id"), "0",
     r"server_list\[0\]\.device\[1\]\.device_id='0' duplicates server_list\[0\]\.device\[0\]\.device_id"),
    ("device_ip not IPv4", ("server_list", 0, "device", 4, "device_ip"), "192.1.27.300",
     r"server_list\[0\]\.device\[4\]\.device_ip='192\.1\.27\.300' is not an IPv4 address"),
    ("duplicate device_ip", ("server_list", 1, "device", 0, "device_ip"), "192.1.27.6",
     r"server_list\[1\]\.device\[0\]\.device_ip='192\.1\.27\.6' duplicates server_list\[0\]\.device\[0\]"),
    ("server_id not IPv4", ("server_list", 1, "server_id"), "node-1",
     r"server_list\[1\]\.server_id='node-1' is not an IPv4 address"),
    ("duplicate server", ("server_list", 1, "server_id"), "10.155.111.140",
     r"server_list\[1\]\.server_id='10\.155\.111\.140' duplicates server_list\[0\]"),
    ("server_count mismatch", ("server_count",), "3", r"server_count='3' does not match the 2 server\(s\)"),
    ("server_count not a number", ("server_count",), "two", r"server_count='two' must be a decimal integer"),
    ("device_id not a number", ("server_list", 0, "device", 0, "device_id"), "zero",
     r"server_list\[0\]\.device\[0\]\.device_id='zero' must be a decimal integer"),
    ("device_id out of range", ("server_list", 0, "device", 0, "device_id"), "64",
     r"server_list\[0\]\.device\[0\]\.device_id='64' must be in \[0, 63\]"),
    ("negative rank", ("server_list", 0, "device", 0, "rank_id"), "-1",
     r"server_list\[0\]\.device\[0\]\.rank_id='-1' must be a decimal integer"),
    ("missing rank_id", ("server_list", 0, "device", 2, "rank_id"), _DELETE,
     r"server_list\[0\]\.device\[2\]\.rank_id is missing"),
    ("missing device_ip", ("server_list", 0, "device", 2, "device_ip"), _DELETE,
     r"server_list\[0\]\.device\[2\]\.device_ip is missing"),
    ("empty device list", ("server_list", 1, "device"), [], r"server_list\[1\]\.device must be a non-empty list"),
    ("unsupported version", ("version",), "2.0", r"version='2\.0' is not supported; supported: 1\.0, 1\.2"),
    ("status", ("status",), "initializing", r"status='initializing' must be \"completed\""),
    ("missing server_list", ("server_list",), _DELETE, r"server_list is missing"),
    ("bad host_nic_ip", ("server_list", 0, "host_nic_ip"), "x", r"server_list\[0\]\.host_nic_ip='x' is not an IPv4"),
    ("device not an object", ("server_list", 0, "device", 5), "5",
     r"server_list\[0\]\.device\[5\] must be a JSON object"),
]


@pytest.mark.parametrize("case, path, value, message", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_each_malformed_case_is_rejected_with_a_message_naming_it(case, path, value, message):
    bad = _set(table_16(), path, value)
    with pytest.raises(RankTableError, match=message):
        validate(bad)


def test_same_device_id_on_different_servers_is_fine():
    table = validate(table_16())
    assert [d.device_id for d in table.servers[0].devices] == [d.device_id for d in table.servers[1].devices]


def test_numbers_and_version_must_be_json_strings():
    """The HCCL format writes every value as a string; a JSON number is named as such (not "unsupported")."""
    with pytest.raises(RankTableError, match=r"server_list\[0\]\.device\[0\]\.rank_id=0 is a JSON number; the HCCL "
                                             r"rank table format needs a string: write \"0\""):
        validate(_set(table_16(), ("server_list", 0, "device", 0, "rank_id"), 0))
    with pytest.raises(RankTableError, match=r"server_count=2 is a JSON number"):
        validate({**table_16(), "server_count": 2})
    with pytest.raises(RankTableError, match=r"device_id=1\.0 is a JSON number"):
        validate(_set(table_16(), ("server_list", 1, "device", 1, "device_id"), 1.0))
    with pytest.raises(RankTableError, match=r'version=1\.0 must be a JSON string such as "1\.0" \(supported: 1\.0, '
                                             r'1\.2\), not a float'):
        validate({**table_16(), "version": 1.0})


def test_schema_1_2_is_read():
    table = {
        "version": "1.2", "server_count": "2", "status": "completed",
        "server_list": [
            {"server_id": "node_0", "host_ip": "172.16.0.100", "device": [
                {"device_id": "0", "device_ip": "192.168.1.8", "super_device_id": "37748736", "rank_id": "0"},
                {"device_id": "1", "device_ip": "192.168.1.9", "super_device_id": "37748737", "rank_id": "1"}]},
            {"server_id": "node_1", "device": [
                {"device_id": "0", "super_device_id": "37748738", "rank_id": "2"}]}],
        "super_pod_list": [{"super_pod_id": "0", "server_list": [{"server_id": "node_0"}, {"server_id": "node_1"}]}],
    }
    parsed = validate(table)
    assert parsed.version == "1.2" and parsed.rank_size == 3
    assert parsed.servers[1].server_id == "node_1" and parsed.servers[1].devices[0].device_ip is None
    with pytest.raises(RankTableError,
                       match=r"super_pod_list\[0\]\.server_list\[1\]\.server_id='node_9' is not a server"):
        validate(_set(table, ("super_pod_list", 0, "server_list", 1, "server_id"), "node_9"))
    with pytest.raises(RankTableError, match=r"already in super_pod_list\[0\]\.server_list\[0\]"):
        validate(_set(table, ("super_pod_list", 0, "server_list", 1, "server_id"), "node_0"))
    with pytest.raises(RankTableError, match=r"server_list\[0\]\.host_ip='172\.16\.0' is not an IPv4"):
        validate(_set(table, ("server_list", 0, "host_ip"), "172.16.0"))
    with pytest.raises(RankTableError, match=r"super_device_id='x'"):
        validate(_set(table, ("server_list", 0, "device", 0, "super_device_id"), "x"))


def test_generate_from_ips_and_from_hccn_conf():
    ips = parse_device_ips("0:192.1.27.6, 1:192.2.27.6,3:192.4.27.6")
    assert ips == {0: "192.1.27.6", 1: "192.2.27.6", 3: "192.4.27.6"}
    table = generate("10.0.0.1", ips)
    assert [(d["device_id"], d["rank_id"]) for d in table["server_list"][0]["device"]] == [("0", "0"), ("1", "1"),
                                                                                         ("3", "2")]
    conf = "# hccn\naddress_0=192.168.10.1\nnetmask_0=255.255.255.0\naddress_1 = 192.168.10.2\naddress_2=192.168.10.3\n"
    from_conf = parse_hccn_conf(conf)
    assert from_conf == {0: "192.168.10.1", 1: "192.168.10.2", 2: "192.168.10.3"}
    chosen = generate("10.0.0.2", from_conf, parse_visible_devices("0,2"))
    assert [d["device_ip"] for d in chosen["server_list"][0]["device"]] == ["192.168.10.1", "192.168.10.3"]
    assert validate(chosen).rank_size == 2
    assert parse_visible_devices("0-3,6") == [0, 1, 2, 3, 6]


@pytest.mark.parametrize("call, message", [
    (lambda: parse_device_ips("0=192.1.1.1"), r"must be DEVICE_ID:IP"),
    (lambda: parse_device_ips("0:192.1.1.1,0:192.1.1.2"), r"lists device 0 twice"),
    (lambda: parse_device_ips("0:300.1.1.1"), r"device_ips\[0\]='300\.1\.1\.1' is not an IPv4"),
    (lambda: parse_hccn_conf("netmask_0=255.0.0.0\n"), r"no 'address_<device_id>=<ip>' line"),
    (lambda: parse_hccn_conf("address_0=1.1.1.1\naddress_0=1.1.1.2\n"), r"line 2: address_0 is given twice"),
    (lambda: parse_hccn_conf("address_1=abc\n"), r"line 1 address_1='abc' is not an IPv4"),
    (lambda: parse_visible_devices("3-1"), r"range '3-1' must be increasing"),
    (lambda: parse_visible_devices("0,a"), r"'a' is not a device id"),
    (lambda: parse_visible_devices("0-2,1"), r"lists a device twice"),
    (lambda: generate("10.0.0.1", {0: "1.1.1.1"}, [0, 1]), r"visible device\(s\) \[1\] have no IP"),
    (lambda: generate("server", {0: "1.1.1.1"}), r"server_ip='server' is not an IPv4"),
])
def test_generation_errors_name_the_argument(call, message):
    with pytest.raises(RankTableError, match=message):
        call()


def test_merge_renumbers_rank_ids_in_server_order():
    raw = table_16()
    first = {**raw, "server_count": "1", "server_list": raw["server_list"][1:]}  # ranks 8..15: a slice
    second = copy.deepcopy({**raw, "server_count": "1", "server_list": raw["server_list"][:1]})
    for device in second["server_list"][0]["device"]:  # any numbering of the input is replaced
        device["rank_id"] = str(7 - int(device["device_id"]))
    merged = merge([first, second])
    parsed = validate(merged)
    assert merged["server_count"] == "2"
    assert [s.server_id for s in parsed.servers] == ["10.155.111.141", "10.155.111.140"]
    assert [d.rank_id for s in parsed.servers for d in s.devices] == list(range(16))
    assert second["server_list"][0]["device"][0]["rank_id"] == "7"  # inputs untouched
    with pytest.raises(RankTableError, match=r"\(input 1: server_list\[0\]\)\.server_id='10\.155\.111\.141' "
                                             r"duplicates \(input 0: server_list\[0\]\)\.server_id"):
        merge([first, first])
    with pytest.raises(RankTableError, match=r"\(b\.json: server_list\[0\]\)\.server_id=.* duplicates "
                                             r"\(a\.json: server_list\[0\]\)"):
        merge([first, first], names=["a.json", "b.json"])
    with pytest.raises(RankTableError, match=r"input 1: server_count='3'"):
        merge([first, {**second, "server_count": "3"}])
    with pytest.raises(RankTableError, match=r"input 0: server_list\[0\]\.device\[2\]\.device_ip='x'"):
        merge([_set(first, ("server_list", 0, "device", 2, "device_ip"), "x"), second])
    with pytest.raises(RankTableError, match="at least one"):
        merge([])


def test_cli_generate_merge_validate_info_devices(tmp_path, capsys):
    conf = tmp_path / "hccn.conf"
    conf.write_text("".join(f"address_{i}=192.5.{i}.1\n" for i in range(4)))
    assert main(["generate", "--server_ip", "10.1.1.1", "--hccn_conf", str(conf), "--visible_devices", "0-3",
                 "-o", str(tmp_path / "a.json")]) == 0
    assert main(["generate", "--server_ip", "10.1.1.2", "--device_ips",
                 ",".join(f"{i}:192.6.{i}.1" for i in range(4)), "-o", str(tmp_path / "b.json")]) == 0
    assert main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(tmp_path / "m.json")]) == 0
    assert main(["validate", str(tmp_path / "m.json"), str(TABLE_16)]) == 0
    assert main(["info", str(tmp_path / "m.json")]) == 0
    assert main(["devices", str(tmp_path / "m.json"), "--server_index", "1"]) == 0
    out = capsys.readouterr().out
    assert "m.json: OK (version 1.0, 2 server(s), 8 ranks)" in out
    assert "rank_size 8" in out and "server 1 10.1.1.2 devices 4 ranks 4..7" in out
    assert out.rstrip().splitlines()[-4:] == [f"{i} {4 + i} 192.6.{i}.1" for i in range(4)]
    assert not list(tmp_path.glob(".*"))  # atomic writes leave no temporary file


def test_cli_errors_exit_2_with_the_file_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_set(table_16(), ("server_list", 1, "device", 3, "rank_id"), "2")))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    cases = [
        (["validate", str(bad)], f"{bad}: server_list[1].device[3].rank_id='2' duplicates"),
        (["validate", str(broken)], f"{broken}: not valid JSON"),
        (["validate", str(tmp_path / "none.json")], "no such rank table file"),
        (["devices", str(TABLE_16), "--server_index", "2"],
         "server_index=2 is out of range: the table has 2 server(s)"),
        (["generate", "--server_ip", "10.0.0.1"], "give exactly one of --device_ips and --hccn_conf"),
        (["merge", str(TABLE_16), str(bad), "-o", str(tmp_path / "x.json")], "bad.json: server_list[1]"),
    ]
    for args, message in cases:
        proc = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
        assert proc.stderr.startswith(f"hccl_tool.py {args[0]}: error: ")


# ---------------------------------------------------------------------------------------------------------------
# hostile input (issue 12 item 5): non-ASCII digits, duplicate keys, deep nesting, bad UTF-8, output folders
# ---------------------------------------------------------------------------------------------------------------
NON_ASCII = [
    ("arabic-indic rank_id", ("server_list", 0, "device", 0, "rank_id"), "\u0660",
     r"server_list\[0\]\.device\[0\]\.rank_id='\u0660' must be a decimal integer string of ASCII digits"),
    ("devanagari device_id", ("server_list", 0, "device", 1, "device_id"), "\u0967",
     r"server_list\[0\]\.device\[1\]\.device_id='\u0967' must be a decimal integer string of ASCII digits"),
    ("fullwidth server_count", ("server_count",), "\uff12", r"server_count='\uff12' must be a decimal integer"),
    ("arabic-indic device_ip", ("server_list", 0, "device", 2, "device_ip"), "192.1.27.\u0666",
     r"device\[2\]\.device_ip='192\.1\.27\.\u0666' is not an IPv4 address \(four dot-separated ASCII"),
    ("arabic-indic server_id", ("server_list", 1, "server_id"), "10.155.111.\u0661\u0664\u0661",
     r"server_list\[1\]\.server_id='10\.155\.111\.\u0661\u0664\u0661' is not an IPv4 address"),
    ("5000-digit rank_id", ("server_list", 0, "device", 0, "rank_id"), "9" * 5000, r"must be a decimal integer"),
]


@pytest.mark.parametrize("case, path, value, message", NON_ASCII, ids=[m[0] for m in NON_ASCII])
def test_numbers_must_be_ascii_digits(case, path, value, message):
    assert int(value[-1]) >= 0  # python's int() itself would take every one of these digits
    with pytest.raises(RankTableError, match=message):
        validate(_set(table_16(), path, value))


def test_numbers_in_arguments_and_hccn_conf_must_be_ascii_digits(tmp_path, capsys):
    with pytest.raises(RankTableError, match=r"visible_devices='\u0660-3'"):
        parse_visible_devices("\u0660-3")
    with pytest.raises(RankTableError, match=r"device id='\u0661' must be a decimal integer string of ASCII"):
        parse_device_ips("\u0661:192.1.27.6")
    with pytest.raises(RankTableError, match=r"hccn.conf line 2: 'address_\u0661=192.1.27.7' is not"):
        parse_hccn_conf("address_0=192.1.27.6\naddress_\u0661=192.1.27.7\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["devices", str(TABLE_16), "--server_index", "\u0661"])
    assert exit_info.value.code == 2
    assert "'\u0661' is not a non-negative integer of ASCII digits 0-9" in capsys.readouterr().err


def _cli(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_duplicate_keys_deep_nesting_and_bad_utf8_are_named_errors(tmp_path):
    text = TABLE_8.read_text()
    twice = tmp_path / "twice.json"
    twice.write_text(text.replace('"rank_id": "3"', '"rank_id": "3", "rank_id": "9"', 1))
    assert twice.read_text() != text
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    nested = tmp_path / "nested.json"  # valid JSON, nesting beyond a rank table's, strings with brackets ignored
    nested.write_text(json.dumps({"version": "1.0", "x": [[[[[[[[["[[[["]]]]]]]]]}))
    latin = tmp_path / "latin1.json"
    latin.write_bytes(text.replace('"completed"', '"compl\u00e9ted"').encode("latin-1"))
    cases = [
        (twice, f"{twice}: key 'rank_id' is given twice in one JSON object (values '3' and '9')"),
        (deep, f"{deep}: JSON nested 100000 levels deep; a rank table nests at most 8"),
        (nested, f"{nested}: JSON nested 10 levels deep"),  # not 14: brackets in strings
        (latin, f"{latin}: not valid UTF-8 (byte 0xe9 at offset"),
    ]
    for path, message in cases:
        with pytest.raises(RankTableError) as info:
            load(path)
        assert str(info.value).startswith(message), str(info.value)
        proc = _cli("validate", path)
        assert proc.returncode == 2 and proc.stderr.startswith(f"hccl_tool.py validate: error: {message}"), \
            proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
    conf = tmp_path / "hccn.conf"
    conf.write_bytes(b"address_0=192.1.27.6\n# caf\xe9\n")
    proc = _cli("generate", "--server_ip", "10.0.0.1", "--hccn_conf", conf, "-o", tmp_path / "t.json")
    assert proc.returncode == 2 and f"{conf}: not valid UTF-8 (byte 0xe9 at offset 26)" in proc.stderr


def test_output_naming_a_folder_is_an_error_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    for args in (["generate", "--server_ip", "10.0.0.1", "--device_ips", "0:192.1.27.6", "-o", out],
                 ["merge", TABLE_8, "-o", out]):
        proc = _cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert f"error: output '{out}' is a folder; give a file name such as '{out / 'rank_table.json'}'" \
            in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(tmp_path.rglob("*")) == [out]
    # a failure after the temporary file exists (here: json.dump of an unserialisable value) removes it
    from rank_table import hccl_tool
    with pytest.raises(TypeError):
        hccl_tool.write({"version": object()}, tmp_path / "t.json")
    assert sorted(tmp_path.rglob("*")) == [out]

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(hccl_tool.os, "replace", refuse)
    with pytest.raises(RankTableError, match=r"output '.*t\.json': cannot write \(Permission denied\)"):
        hccl_tool.write({"version": "1.0"}, tmp_path / "t.json")
    assert sorted(tmp_path.rglob("*")) == [out]
