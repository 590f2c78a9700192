"""The rules table and its one judge (issue 38): the same situation gets the same severity
whichever stack shows it, the TCP-between-nodes rule is one row, and a site's rows are data."""

from __future__ import annotations

from pathlib import Path

import pytest

from dedal.errors import UserError
from dedal.model.envfile import load_rules_file, parse_env
from dedal.stages.verify import preflight as pre
from dedal.stages.verify import judge as J
from dedal.stages.verify import rules as R
from dedal.stages.verify.facts import Seen
from dedal.stages.verify.parsers import parse_text
from dedal.stages.verify.transports import HostFacts, check_transports

# one line each, as UCX, Open MPI (btl_base_verbose) and NCCL (NCCL_DEBUG=INFO) print them, of
# traffic between two nodes (n1 -> n2) or within one (n1 -> n1) going over TCP
TCP_LINES = {
    ("ucx", "inter-node"): "[1.0] [n1:7:0] ucp_worker.c:1903 UCX  INFO    ucp_context_0 inter-node cfg#2 tag(tcp/eth0)",
    ("ompi", "inter-node"): "[n1:1234] mca: bml: Using tcp btl for send to [[52108,1],1] on node n2",
    ("nccl", "inter-node"): "n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    ("ucx", "intra-node"): "[1.0] [n1:7:0] ucp_worker.c:1903 UCX  INFO    ucp_context_0 intra-node cfg#1 tag(tcp/lo)",
    ("ompi", "intra-node"): "[n1:1234] mca: bml: Using tcp btl for send to [[52108,1],1] on node n1",
}
TCP_CODES = {
    "ucx-tcp-inter-node",
    "ompi-tcp-inter-node",
    "nccl-socket-transport",
    "ucx-tcp-intra-node",
    "ompi-tcp-intra-node",
}
HOSTS = {
    "with a fabric": HostFacts(has_infiniband=True, multi_node=True),
    "without a fabric": HostFacts(has_infiniband=False, multi_node=True),
}


def _severity(stack: str, scope: str, host) -> str:
    parsed = parse_text(TCP_LINES[(stack, scope)] + "\n")
    (f,) = [f for f in check_transports([parsed], host) if f.code in TCP_CODES]
    return f.severity


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize("scope", ["inter-node", "intra-node"])
def test_same_host_facts_same_severity_whatever_the_stack(host: str, scope: str) -> None:
    """A table: UCX, Open MPI and NCCL over TCP in the same scope on the same host are graded alike
    (before issue 38 NCCL over sockets without InfiniBand stayed a warning, UCX and Open MPI info)."""
    found = {stack: _severity(stack, where, HOSTS[host]) for stack, where in TCP_LINES if where == scope}
    assert len(set(found.values())) == 1, found
    want = "info" if (scope, host) == ("inter-node", "without a fabric") else "error"
    assert set(found.values()) == {want}


def test_the_log_alone_grades_every_stack_alike() -> None:
    """dedal verify parse knows no host: TCP between nodes is a fallback, whatever the stack."""
    for (stack, scope), line in TCP_LINES.items():
        (f,) = [f for f in parse_text(line + "\n")["findings"] if f["code"] in TCP_CODES]
        assert f["severity"] == "error", (stack, scope)


def test_tcp_between_nodes_is_one_row_for_every_stack_and_measurement() -> None:
    """The rule 'TCP between nodes is fine without an RDMA network' is written once: the one
    context row; every row that means TCP (transports and TCP-like numbers) is re-graded by it."""
    (row,) = [r for r in R.RULES if r.context and r.means == "tcp"]
    assert row is R.TCP_BETWEEN_NODES_WITHOUT_FABRIC and dict(row.host) == {"fabric": False}
    assert not [r for r in R.RULES if not r.context and ("fabric", False) in r.host and r.means == "tcp"]
    meaning_tcp = {r.code for r in R.RULES if r.means == "tcp" and not r.context}
    assert {
        "ucx-tcp-inter-node",
        "ompi-tcp-inter-node",
        "nccl-socket-transport",
        "latency-tcp-like",
        "bandwidth-tcp-like",
        "busbw-socket-like",
    } <= meaning_tcp
    osu = "# OSU MPI Latency Test v7.4\n# Size          Latency (us)\n0    72.00\n1    72.50\n"
    graded = {
        f["code"]: f["severity"]
        for f in parse_text(osu, host=HOSTS["without a fabric"], scope="inter-node")["findings"]
    }
    assert graded["latency-tcp-like"] == "info"
    assert {f["code"]: f["severity"] for f in parse_text(osu)["findings"]}["latency-tcp-like"] == "error"


def test_the_table_is_consistent() -> None:
    assert R.check_table() == []
    assert R.check_table([R.rule("x", "ucx:tcp", "{items} {value}")]) == ["x: message: 'value'"]
    assert R.check_table([R.rule("x", "ucx:teleport", "m")]) == ["x: reads ucx:teleport, not a fact"]
    assert R.check_table([R.rule("x", "ucx:tcp", "m", host={"site": "aws"})])[0].startswith("x: host condition")
    # the most specific row wins: the NCCL SHM hop where P2P works is an error, unknown a warning, none info
    hop = [Seen("nccl", "shm-hop", "gpu", ("SHM/direct/direct: 4",), ("... via SHM/direct/direct",))]
    assert [f.severity for f in J.judge(hop, host=HostFacts(gpu_p2p=True))] == ["error"]
    assert [f.severity for f in J.judge(hop, host=HostFacts())] == ["warning"]
    assert [f.severity for f in J.judge(hop, host=HostFacts(gpu_p2p=False))] == ["info"]


def test_the_preflight_says_what_the_table_says(tmp_path: Path) -> None:
    (none,) = pre.check_infiniband([], multi_node=True)
    assert "expected, not a fallback" in none.message
    never = R.with_site(
        R.rules_from_config(
            [
                {
                    "code": "*",
                    "means": "tcp",
                    "severity": "error",
                    "when": {"scope": "inter-node", "host": {"fabric": False}},
                }
            ]
        )
    )
    (strict,) = pre.check_infiniband([], multi_node=True, rows=never)
    assert "is a fallback" in strict.message
    cxi = tmp_path / "dev"
    cxi.mkdir()
    (cxi / "cxi0").touch()
    assert pre.slingshot(cxi) == ["cxi0"]


def test_a_site_row_overrides_and_adds(tmp_path: Path) -> None:
    """'Slingshot needs the OFI plugin' and 'sockets between nodes are only a warning here' as
    data: a site's rows in the environment file, checked by the schema, judged by the one judge."""
    env = tmp_path / "env.yaml"
    env.write_text("""spack: {specs: [zlib]}
dedal:
  verify:
    rules:
      - code: nccl-socket-transport
        when: {seen: "nccl:tcp", scope: inter-node}
        severity: warning
        message: "NCCL over sockets ({items}): this site's Ethernet nodes"
      - code: site-nccl-plugin-missing
        when: {seen: "nccl:plugin-not-found", host: {fabric: true}}
        severity: error
        message: "Slingshot needs the OFI plugin (aws-ofi-nccl)"
""")
    rows = R.with_site(R.rules_from_config(parse_env(__import__("yaml").safe_load(env.read_text()), env).verify.rules))
    hsn = (
        "n1:1:1 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation\n"
        "n1:1:1 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.253.1.200<0>\nn1:1:1 [0] NCCL INFO Using network Socket\n"
    )
    codes = {f["code"]: f for f in parse_text(hsn, rows=rows)["findings"]}
    assert codes["site-nccl-plugin-missing"]["severity"] == "error"  # added: the log names a fabric (hsn0)
    assert "site-nccl-plugin-missing" not in {
        f["code"] for f in parse_text(hsn.replace("hsn0", "eth0"), rows=rows)["findings"]
    }
    sock = parse_text(TCP_LINES[("nccl", "inter-node")] + "\n", rows=rows)
    (f,) = [f for f in sock["findings"] if f["code"] == "nccl-socket-transport"]
    assert f["severity"] == "warning" and "this site's Ethernet nodes" in f["message"]
    assert {f["code"] for f in parse_text(TCP_LINES[("nccl", "inter-node")] + "\n")["findings"]} >= {
        "nccl-socket-transport"
    }  # dedal's own row where the site has none


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"code": "x", "when": {"seen": "nccl:tcp"}, "severity": "fatal"}, "severity"),
        (
            {"code": "x", "when": {"seen": "nccl:tcp", "host": {"site": True}}, "severity": "error"},
            "unknown key 'site'",
        ),
        ({"code": "x", "when": {"seen": "nccl:tcp"}}, "missing key 'severity'"),
    ],
)
def test_the_schema_names_a_wrong_site_row(tmp_path: Path, row, problem) -> None:
    env = tmp_path / "env.yaml"
    with pytest.raises(UserError, match=problem):
        parse_env({"spack": {"specs": []}, "dedal": {"verify": {"rules": [row]}}}, env)


def test_a_row_that_could_never_fire_is_refused() -> None:
    with pytest.raises(UserError, match=r"dedal.verify.rules.0: x: reads nccl:teleport, not a fact"):
        R.rules_from_config([{"code": "x", "when": {"seen": "nccl:teleport"}, "severity": "error"}])


def test_the_site_file_of_the_verify_rules_setting(tmp_path: Path) -> None:
    f = tmp_path / "rules.yaml"
    f.write_text(
        "rules:\n  - {code: '*', means: tcp, severity: warning, when: {scope: inter-node, host: {fabric: false}}}\n"
    )
    (row,) = R.rules_from_config(load_rules_file(f))
    assert row.context and row.severity == "warning"
    f.write_text("rules:\n  - {code: x}\n")
    with pytest.raises(UserError, match="missing key 'when'"):
        load_rules_file(f)
