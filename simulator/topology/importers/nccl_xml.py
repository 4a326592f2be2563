"""NCCL's topology XML (the file ``NCCL_TOPO_DUMP_FILE`` writes) as a ccsim server preset.

One dump describes one server as NCCL sees it::

    <system version="1">
      <cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
        <pci busid="0000:17:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
          <pci busid="0000:19:00.0" class="0x030200" device="0x2330" link_speed=... link_width=...>
            <gpu dev="0" sm="90" rank="0" gdr="1">
              <nvlink target="0000:05:00.0" count="5" tclass="0x068000"/>
            </gpu>
          </pci>
          <pci busid="0000:18:00.0" class="0x020700" link_speed=... link_width=...>
            <nic><net name="mlx5_0" dev="0" speed="400000" port="1" latency="0" gdr="1"/></nic>
          </pci>
        </pci>
      </cpu>
    </system>

:func:`read_nccl_xml` turns it into the data of a preset file (``server``, ``nccl``), so
``--nodes`` and ``--fabric`` build clusters of it exactly as they do of a bundled preset.
Elements and attributes are those NCCL 2.30 reads (github.com/NVIDIA/nccl, ``src/graph/``:
``xml.cc:359-402`` lists which element may hold which, ``topo.cc`` reads them); NCCL
ignores other elements, this reader refuses them, naming the file, line and element.

Figures, per direction
    * PCIe: each ``<pci>`` is the link to its parent at ``link_speed`` (GT/s per lane, the
      strings of NCCL's ``kvDictPciGen``, ``topo.cc:545-556``) x ``link_width`` lanes
      (0 means 16, ``topo.cc:655``) x the line code (8b/10b up to 5 GT/s, 128b/130b from
      8 GT/s, none at 64 GT/s) / 8: Gen5 x16 = 63.0 GB/s. NCCL's own figure is
      ``width x speed / 80`` GB/s with speed in 100 Mb/s per lane (``topo.cc:657``), 48 GB/s
      for Gen5 x16; an empty or ``Unknown`` speed is NCCL's fallback, Gen3 (``topo.cc:556``).
    * NVLink: ``count`` links x the per-link line rate of the GPU's ``sm``, in the order of
      ``ncclTopoNVLinkBw`` (``topo.h:274-281``); NCCL's figures are ``SM60_NVLINK_BW`` ...
      ``SM100_NVLINK_BW`` (``topo.h:19-24``). A GPU's links to several NVSwitch chips add up
      on one NVSwitch node, as NCCL joins every NVSwitch into one (``topo.cc:849-853``,
      ``topo.cc:181``). ``tclass`` picks the far end (``topo.cc:832-858``): a GPU
      (``0x03...``, by ``target`` bus id), the GPU's CPU (``0x068001``), else the NVSwitch
      (``0x068000``).
    * C2C (Grace): ``count`` x ``bw`` MB/s to the GPU's CPU (``topo.cc:921-923``).
    * NICs: ``<net speed>`` is Mb/s (``net_v11.h:33``; NCCL divides by 8000 for GB/s,
      ``topo.cc:418``; 0 or -1 means 10 Gb/s, ``topo.cc:417``), ``latency`` is
      microseconds (NCCL adds it to its microsecond latencies, ``tuning.cc:389``). Each
      ``<net>`` is one ccsim NIC hanging off the parent of its ``<pci>`` through that
      ``<pci>``'s link (a ``<nic>`` right under a ``<cpu>`` hangs off the CPU directly).
    * CPU sockets: every two are joined at NCCL's inter-socket figure for the CPU
      (``ncclTopoGetInterCpuBw``, ``topo.cc:60-82``; ``QPI_BW``, ``AMD_BW``... in
      ``topo.h:26-34``), a link named ``sys``.
    * ``<pcilink>`` (two PCIe switches joined privately): NCCL's local figure ``LOC_BW``
      (``topo.h:17``, ``topo.cc:891``).

The links carry line rates, as every preset's do; the preset's ``nccl.efficiency`` holds
what NCCL's model makes of them (NVLink: NCCL's per-link figure / the line rate, 20.6 / 25
on sm90; PCIe: 0.762), as the bundled ``dgx-h100`` preset does by hand.

What a dump does not say
    Link latencies (the links have none: edit the preset, see :func:`read_nccl_xml`),
    whether the NVSwitch reduces in the switch (NVLS: taken as yes for sm90 and later on
    an NVSwitch, which NVLink SHARP needs and offers), GPUDirect RDMA (``gdr``), NIC
    ports sharing one card's PCIe link, and which GPU model it is beyond ``sm``: a PCI
    ``device`` id in :data:`GPU_MODELS` names it, else the model is ``sm90`` etc.
Only the NICs of the highest speed are kept (a server's compute NICs; storage and
management ports are slower), and they must share one PCIe link speed and latency, as
a preset's ``nic`` section describes identical NICs. GPUs without a ``rank`` are not in
the job and are left out (``topo.cc:664-665``); GPU ``k`` of the preset is the k-th by rank.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.parsers import expat

from ...errors import TopologyError, shown
from ...files import read_text

#: NCCL_TOPO_XML_VERSION (xml.h:50).
XML_VERSION = "1"
#: Elements each element may hold (xml.cc:359-402).
CHILDREN = {
    "system": ("cpu",),
    "cpu": ("pci", "nic"),
    "pci": ("pci", "gpu", "nic", "pcilink"),
    "gpu": ("nvlink", "c2c"),
    "nic": ("net",),
    "net": (),
    "nvlink": (),
    "c2c": (),
    "pcilink": (),
}
#: NCCL's LOC_BW, GB/s (topo.h:17).
LOC_BW = 5000.0
#: NVLink per link and direction: (lowest sm, line rate bytes/s, NCCL's GB/s), in
#: ncclTopoNVLinkBw's order (topo.h:274-281). Line rates are the datasheets' per-GPU
#: totals (both directions) / links / 2: B200 1.8 TB/s over 18 links, H100 900 GB/s
#: over 18, RTX A6000 (sm86, NVLink bridge) 112.5 GB/s over 4, A100 600 GB/s over 12,
#: V100 300 GB/s over 6, P100 160 GB/s over 4. NCCL's figures: topo.h:19-24.
NVLINK = (
    (100, 50e9, 40.1),
    (90, 25e9, 20.6),
    (86, 14.0625e9, 12.0),  # only sm == 86 (topo.h:277)
    (80, 25e9, 20.0),
    (70, 25e9, 20.0),
    (60, 20e9, 18.0),
)
#: NCCL's fallback for any other sm is SM80's figure (topo.h:281).
NVLINK_FALLBACK = (25e9, 20.0)
#: PCIe per lane: GT/s -> (line-code efficiency, NCCL's x100 Mb/s per lane: topo.cc:545-556).
PCIE = {
    2.5: (8 / 10, 15),
    5.0: (8 / 10, 30),
    8.0: (128 / 130, 60),
    16.0: (128 / 130, 120),
    32.0: (128 / 130, 240),
    64.0: (1.0, 480),  # PCIe 6.0: PAM4 FLIT mode, no line code (FLIT framing not counted)
}
#: Compute capabilities (major x 10 + minor) are below this: the newest GPUs are 12.x.
MAX_SM = 200
#: NCCL's speed when link_speed is empty or unknown: Gen3 (topo.cc:556).
PCIE_FALLBACK_GTS = 8.0
#: NVIDIA PCI device ids (vendor 0x10de) -> model, as the PCI ID database
#: (pci-ids.ucw.cz) names them; ccsim's workload and library layers match these names.
GPU_MODELS = {
    0x20B0: "A100-SXM4-40GB",
    0x20B2: "A100-SXM4-80GB",
    0x20B5: "A100-PCIE-80GB",
    0x2330: "H100-SXM5-80GB",
    0x2331: "H100-PCIE",
    0x2901: "B200",
}
NVIDIA = 0x10DE


def read_nccl_xml(path: str | Path) -> dict[str, Any]:
    """Read an NCCL topology dump into the data of a preset file.

    The result has ``name``, ``description``, ``server`` (the GPUs, the PCIe tree with
    its switches and CPUs, NVLinks and NVSwitch, NICs) and ``nccl`` (NCCL's link
    efficiencies); :func:`simulator.topology.load_topology` builds it like any preset,
    and ``yaml.safe_dump`` of it is a preset file to edit (add latencies, a fabric).

    Examples
    --------
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "topo.xml")
    >>> _ = open(path, "w").write('''<system version="1"><cpu numaid="0">
    ...   <pci busid="0000:01:00.0" class="0x030200" link_speed="16.0 GT/s PCIe"
    ...        link_width="16"><gpu dev="0" sm="80" rank="0" gdr="1"/></pci>
    ...   <pci busid="0000:02:00.0" class="0x030200" link_speed="16.0 GT/s PCIe"
    ...        link_width="16"><gpu dev="1" sm="80" rank="1" gdr="1"/></pci>
    ... </cpu></system>''')
    >>> server = read_nccl_xml(path)["server"]
    >>> server["gpus"], server["links"][0]["ends"], round(server["links"][0]["bandwidth"] / 1e9, 2)
    (2, ['gpu0', 'cpu0'], 31.51)
    """
    path = Path(path)
    text = read_text(path, what="NCCL topology XML", error=TopologyError)
    root = parse_xml(text, source=path.name)
    return _Import(path.name).preset(root, name=path.stem)


@dataclass
class Element:
    """One XML element: tag, attributes, the line it starts on, children in order."""

    tag: str
    attrs: dict[str, str]
    line: int
    parent: Element | None = None
    children: list[Element] = field(default_factory=list)


def parse_xml(text: str, *, source: str) -> Element:
    """Parse XML ``text`` into :class:`Element` s with line numbers; refuse DTDs and
    entities (NCCL's own parser has neither) and any element NCCL does not read.

    >>> parse_xml('<system version="1"><cpu numaid="0"/></system>', source="t").children[0].line
    1
    """
    parser = expat.ParserCreate()
    stack: list[Element] = []
    roots: list[Element] = []

    def start(tag: str, attrs: dict[str, str]) -> None:
        element = Element(tag, dict(attrs), parser.CurrentLineNumber)
        if stack:
            parent = stack[-1]
            allowed = CHILDREN.get(parent.tag, ())
            if tag not in allowed:
                inside = ", ".join(f"<{name}>" for name in allowed) or "nothing"
                raise TopologyError(
                    f"{source} line {element.line}: unknown element <{tag}> inside "
                    f"<{parent.tag}>; NCCL's topology XML has {inside} there"
                )
            element.parent = parent
            parent.children.append(element)
        elif tag != "system":
            raise TopologyError(
                f"{source} line {element.line}: the top element is <{tag}>; an NCCL topology "
                'XML (NCCL_TOPO_DUMP_FILE) starts with <system version="1">'
            )
        else:
            roots.append(element)
        stack.append(element)

    def refuse(*_: Any) -> None:
        raise TopologyError(
            f"{source} line {parser.CurrentLineNumber}: DTDs and entities are not part of "
            "NCCL's topology XML; remove them"
        )

    parser.StartElementHandler = start
    parser.EndElementHandler = lambda tag: stack.pop()
    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    try:
        parser.Parse(text, True)
    except expat.ExpatError as error:
        raise TopologyError(
            f"{source} line {error.lineno}: not well-formed XML: {expat.ErrorString(error.code)}"
        ) from None
    if not roots:
        raise TopologyError(f"{source}: no <system> element; is this an NCCL topology XML?")
    return roots[0]


@dataclass
class _Gpu:
    element: Element
    rank: int
    sm: int
    busid: int
    host: str  # the node its PCIe link reaches
    cpu: str
    pcie: float  # bytes/s of that link
    model: str | None


@dataclass
class _Net:
    element: Element
    dev: int
    speed: float  # bytes/s
    latency: float  # s
    host: str
    pcie: float | None  # bytes/s of the NIC's PCIe link; None: hangs off the CPU directly


class _Import:
    """The walk over one dump, collecting the parts of a server spec."""

    def __init__(self, source: str):
        self.source = source
        self.devices: dict[str, dict[str, str]] = {}
        self.links: dict[frozenset, dict[str, Any]] = {}
        self.gpus: list[_Gpu] = []
        self.nets: list[_Net] = []
        self.switches: dict[int, str] = {}  # PCIe switch bus id -> node
        self.pcilinks: list[tuple[str, Element]] = []
        self.pcie_share: float | None = None  # NCCL's PCIe figure / line rate, GPU links

    # -- attributes -------------------------------------------------------------------

    def where(self, element: Element) -> str:
        return f"{self.source} line {element.line}: <{element.tag}>"

    def text(self, element: Element, key: str) -> str:
        if key not in element.attrs:
            raise TopologyError(
                f"{self.where(element)} has no '{key}' attribute; NCCL writes one there"
            )
        return element.attrs[key]

    def integer(self, element: Element, key: str, default: int | None = None) -> int:
        """An integer attribute as NCCL's strtol(value, 0) reads it (decimal or 0x hex)."""
        if default is not None and key not in element.attrs:
            return default
        value = self.text(element, key).strip()
        try:
            return int(value, 16) if value.lower().startswith(("0x", "-0x")) else int(value)
        except ValueError:
            raise TopologyError(
                f"{self.where(element)} attribute {key}={shown(value)} is not an integer"
            ) from None

    def number(self, element: Element, key: str, default: float) -> float:
        if key not in element.attrs:
            return default
        value = element.attrs[key].strip()
        try:
            result = float(value)
        except ValueError:
            result = float("nan")
        if not (result >= 0 and result < float("inf")):
            raise TopologyError(
                f"{self.where(element)} attribute {key}={shown(value)} is not a number >= 0"
            )
        return result

    def busid(self, element: Element, key: str) -> int:
        """A PCI bus id as NCCL's busIdToInt64 reads it: its hex digits, separators dropped."""
        value = self.text(element, key)
        digits = re.sub(r"[^0-9a-fA-F]", "", value.replace("0x", ""))
        if not digits or not re.fullmatch(r"[0-9a-fA-F:.x]+", value.strip()):
            raise TopologyError(
                f"{self.where(element)} attribute {key}={shown(value)} is not a PCI bus id "
                "such as 0000:17:00.0"
            )
        return int(digits, 16)

    def pcie(self, element: Element) -> tuple[float, float]:
        """The line rate of a ``<pci>``'s link (bytes/s) and NCCL's figure / it."""
        speed_text = self.text(element, "link_speed")
        width = self.integer(element, "link_width")
        if width < 0:
            raise TopologyError(
                f"{self.where(element)} attribute link_width={width} is negative; write the "
                "lane count (x16: 16)"
            )
        width = width or 16  # topo.cc:655
        match = re.match(r"\s*([0-9]*\.?[0-9]+)\s*GT/s", speed_text)
        if match:
            gts = float(match.group(1))
            if gts not in PCIE:
                raise TopologyError(
                    f"{self.where(element)} attribute link_speed={shown(speed_text)}: no PCIe "
                    "generation runs at that rate; use one of "
                    + ", ".join(f"{rate:g} GT/s" for rate in PCIE)
                )
        elif not speed_text.strip() or speed_text.strip().lower().startswith("unknown"):
            gts = PCIE_FALLBACK_GTS
        else:
            raise TopologyError(
                f"{self.where(element)} attribute link_speed={shown(speed_text)} is not a "
                "PCIe speed such as '32.0 GT/s PCIe'"
            )
        code, nccl_per_lane = PCIE[gts]
        line = gts * 1e9 * width * code / 8
        return line, width * nccl_per_lane / 80.0 * 1e9 / line

    # -- the walk ---------------------------------------------------------------------

    def preset(self, root: Element, *, name: str) -> dict[str, Any]:
        version = root.attrs.get("version")
        if version != XML_VERSION:
            raise TopologyError(
                f"{self.where(root)} has version={shown(version)}; NCCL writes and reads "
                f'version="{XML_VERSION}"'
            )
        hosts = {cpu.attrs.get("host_hash") for cpu in root.children}
        if len(hosts) > 1:
            raise TopologyError(
                f"{self.source}: the file describes {len(hosts)} hosts (host_hash); import the "
                "dump of one server, --nodes makes the cluster"
            )
        cpus = []
        for index, cpu in enumerate(root.children):
            node = f"cpu{index}"
            self.devices[node] = {"kind": "cpu"}
            cpus.append((node, cpu))
            for child in cpu.children:
                if child.tag == "pci":
                    self.pci(child, parent=node, cpu=node)
                else:
                    self.nic(child, host=node, pcie=None)
        if not self.gpus:
            raise TopologyError(
                f"{self.source}: no <gpu> with a rank; NCCL writes the GPUs of its job, each "
                "as <gpu rank=...> inside a <pci>"
            )
        self.gpus.sort(key=lambda gpu: gpu.rank)
        for first, second in itertools.pairwise(self.gpus):
            if first.rank == second.rank:
                raise TopologyError(
                    f"{self.where(second.element)} has rank {second.rank}, as line "
                    f"{first.element.line} has; ranks are unique"
                )
        sms = {gpu.sm for gpu in self.gpus}
        if len(sms) > 1:
            raise TopologyError(
                f"{self.source}: GPUs of different sm ({', '.join(map(str, sorted(sms)))}); a "
                "ccsim server has one GPU model"
            )
        sm = self.gpus[0].sm
        models = {gpu.model for gpu in self.gpus}
        model = models.pop() if len(models) == 1 and None not in models else f"sm{sm}"
        local = {id(gpu.element): f"gpu{k}" for k, gpu in enumerate(self.gpus)}
        for gpu in self.gpus:
            self.link(local[id(gpu.element)], gpu.host, gpu.pcie, "pcie")
        nvswitch = self.nvlinks(local)
        self.cpu_links(cpus)
        for switch, element in self.pcilinks:
            target = self.switches.get(self.busid(element, "target"))
            if target is not None and target != switch:  # topo.cc:891: only if it exists
                self.link(switch, target, LOC_BW * 1e9, "pcie")

        server: dict[str, Any] = {"gpus": len(self.gpus), "gpu": {"model": model}}
        nvlink_share = self.nvlink_rate(sm)[1] * 1e9 / self.nvlink_rate(sm)[0]
        if nvswitch and len(set(nvswitch.values())) == 1 and len(nvswitch) == len(self.gpus):
            # Every GPU has the same NVLinks to the NVSwitch: the `intra` shorthand, which
            # can say the switch reduces (NVLS needs sm90+, NCCL's NVLS kernels).
            server["intra"] = {
                "kind": "nvswitch",
                "link": "nvlink",
                "bandwidth": next(iter(nvswitch.values())),
                "nvls": sm >= 90,
            }
        elif nvswitch:
            self.devices["nvswitch"] = {"kind": "nvswitch"}
            for gpu, bandwidth in nvswitch.items():
                self.link(gpu, "nvswitch", bandwidth, "nvlink")
        server["devices"] = self.devices
        server["links"] = [
            {"ends": entry["ends"], "bandwidth": entry["bandwidth"], "link": entry["link"]}
            for entry in self.links.values()
        ]
        nic, nic_note = self.nic_section()
        if nic is not None:
            server["nic"] = nic
        efficiency = {"pcie": self.pcie_share} if self.pcie_share is not None else {}
        if any(entry["link"] == "nvlink" for entry in self.links.values()) or "intra" in server:
            efficiency["nvlink"] = nvlink_share
        nvlinks = sum(nvswitch.values()) / len(self.gpus) if nvswitch else 0.0
        description = (
            f"imported from NCCL topology XML {self.source}: {len(self.gpus)}x {model}"
            + (f", NVSwitch {nvlinks / 1e9:.4g} GB/s/dir per GPU" if nvswitch else "")
            + (
                f", {len(nic['attach'])} NICs at {nic['bandwidth'] * 8 / 1e9:g} Gb/s"
                if nic is not None
                else ", no NICs"
            )
            + nic_note
        )
        return {
            "name": name,
            "description": description,
            "server": server,
            "nccl": {"efficiency": efficiency},
        }

    def pci(self, element: Element, *, parent: str, cpu: str) -> None:
        """One ``<pci>``: a GPU, a NIC, a PCIe switch, or something NCCL leaves out."""
        kind = _pci_type(self.text(element, "class"))
        busid = self.busid(element, "busid")
        gpus = [child for child in element.children if child.tag == "gpu"]
        nics = [child for child in element.children if child.tag == "nic"]
        if gpus:
            if len(gpus) > 1:
                raise TopologyError(
                    f"{self.where(gpus[1])}: several GPUs on one PCI device (MIG or MLOPart "
                    "partitions) are not supported; keep one <gpu> per <pci>"
                )
            gpu = gpus[0]
            if "rank" not in gpu.attrs:
                return  # not in the job (topo.cc:664-665)
            line, share = self.pcie(element)
            if self.pcie_share is None:
                self.pcie_share = share
            sm = self.integer(gpu, "sm")
            if not 0 < sm < MAX_SM:
                # NCCL writes major x 10 + minor (90 for 9.0, 100 for B200's 10.0); the
                # newest GPUs are 12.x, so four digits are a typo, not a GPU.
                raise TopologyError(
                    f"{self.where(gpu)} attribute sm={sm} is not a compute capability; write "
                    f"it as NCCL does, major x 10 + minor below {MAX_SM} (90 for sm 9.0, 100 "
                    "for 10.0)"
                )
            self.gpus.append(
                _Gpu(gpu, self.integer(gpu, "rank"), sm, busid, parent, cpu, line, _model(element))
            )
            return
        if nics:
            # A <pci> holding a <nic> is a NIC whatever its class (topo.cc:671-673).
            line, _ = self.pcie(element)
            for nic in nics:
                self.nic(nic, host=parent, pcie=line)
            return
        if kind != "pci" or not _holds_device(element):
            return  # NCCL adds only PCI-class devices (topo.cc:684); empty ones add nothing
        node = f"pcie{len(self.switches)}"
        self.switches[busid] = node
        self.devices[node] = {"kind": "pcie_switch"}
        self.link(node, parent, self.pcie(element)[0], "pcie")
        for child in element.children:
            if child.tag == "pci":
                self.pci(child, parent=node, cpu=cpu)
            elif child.tag == "pcilink":
                self.pcilinks.append((node, child))

    def nic(self, element: Element, *, host: str, pcie: float | None) -> None:
        for net in element.children:
            if self.integer(net, "net", 1) == 0:
                continue  # a GIN/RMA-only device, not a network (topo.cc:499-505)
            mbps = self.integer(net, "speed", 0)
            if mbps < -1:
                raise TopologyError(
                    f"{self.where(net)} attribute speed={mbps} is negative; write the NIC's "
                    "speed in Mb/s as NCCL does (400000 for 400 Gb/s), or -1 if unknown"
                )
            if mbps <= 0:
                mbps = 10000  # topo.cc:417: some NICs report -1 (unknown), as NCCL reads it
            self.nets.append(
                _Net(
                    net,
                    self.integer(net, "dev"),
                    mbps * 1e6 / 8,
                    self.number(net, "latency", 0.0) / 1e6,
                    host,
                    pcie,
                )
            )

    def nvlink_rate(self, sm: int) -> tuple[float, float]:
        """(line rate bytes/s, NCCL's GB/s) of one NVLink of a GPU of compute capability sm."""
        for lowest, line, nccl in NVLINK:
            exact = lowest == 86  # topo.h:277 tests sm == 86, the others sm >= lowest
            if (sm == lowest) if exact else (sm >= lowest):
                return line, nccl
        return NVLINK_FALLBACK

    def nvlinks(self, local: dict[int, str]) -> dict[str, float]:
        """Add GPU-GPU and GPU-CPU NVLinks and C2C links; return NVSwitch bytes/s per GPU."""
        by_busid = {gpu.busid: gpu for gpu in self.gpus}
        nvswitch: dict[str, float] = {}
        pairs: dict[frozenset, tuple[float, Element]] = {}
        for gpu in self.gpus:
            name = local[id(gpu.element)]
            per_link = self.nvlink_rate(gpu.sm)[0]
            for child in gpu.element.children:
                if child.tag == "c2c":
                    count, mbps = self.integer(child, "count"), self.integer(child, "bw")
                    if count > 0 and mbps > 0:
                        self.link(name, gpu.cpu, count * mbps * 1e6, "c2c")  # topo.cc:923
                    continue
                count = self.integer(child, "count")
                if count < 0:
                    raise TopologyError(
                        f"{self.where(child)} attribute count={count}; write the number of links"
                    )
                if count == 0:
                    continue
                bandwidth = count * per_link
                target = _pci_type(self.text(child, "tclass"))
                if target == "gpu":
                    peer = by_busid.get(self.busid(child, "target"))
                    if peer is None or peer is gpu:
                        continue  # a GPU outside the job: NCCL finds no node (topo.cc:839-843)
                    pair = frozenset((name, local[id(peer.element)]))
                    if pair in pairs:
                        # Both GPUs list the same links; they must agree.
                        seen, other = pairs[pair]
                        if seen != bandwidth:
                            raise TopologyError(
                                f"{self.where(child)} gives {bandwidth / per_link:g} links to "
                                f"{self.text(child, 'target')}, line {other.line} gives "
                                f"{seen / per_link:g} the other way; make the counts agree"
                            )
                        continue
                    pairs[pair] = (bandwidth, child)
                    self.link(name, local[id(peer.element)], bandwidth, "nvlink")
                elif target == "cpu":
                    self.link(name, gpu.cpu, bandwidth, "nvlink")
                else:
                    nvswitch[name] = nvswitch.get(name, 0.0) + bandwidth
        return nvswitch

    def cpu_links(self, cpus: list[tuple[str, Element]]) -> None:
        """Join every two CPU sockets as ncclTopoConnectCpus does (topo.cc:270-281)."""
        for (a, first), (b, _) in itertools.combinations(cpus, 2):
            self.link(a, b, self.inter_cpu(first) * 1e9, "sys")

    def inter_cpu(self, cpu: Element) -> float:
        """NCCL's inter-socket GB/s for ``cpu`` (ncclTopoGetInterCpuBw, topo.cc:60-82;
        the models at topo.cc:748-756, the figures at topo.h:26-34)."""
        arch = self.text(cpu, "arch")
        if arch.startswith("ppc64"):
            return 32.0  # P9_BW
        if arch.startswith("arm64"):
            return 6.0  # ARM_BW
        if not arch.startswith("x86_64"):
            return LOC_BW
        vendor = self.text(cpu, "vendor")
        if vendor.startswith("GenuineIntel"):
            family, model = self.integer(cpu, "familyid"), self.integer(cpu, "modelid")
            if family == 6 and model >= 0xCF:
                return 40.0  # ERP_QPI_BW (Emerald Rapids)
            if family == 6 and model >= 0x8F:
                return 22.0  # SRP_QPI_BW (Sapphire Rapids)
            if family == 6 and model >= 0x55:
                return 10.0  # SKL_QPI_BW (Skylake)
            return 6.0  # BDW_QPI_BW (Broadwell)
        if vendor.startswith("AuthenticAMD"):
            return 16.0  # AMD_BW
        if vendor.startswith(("CentaurHauls", "  Shanghai  ")):
            family, model = self.integer(cpu, "familyid"), self.integer(cpu, "modelid")
            return 9.0 if family == 7 and model == 0x5B else 6.0  # YONGFENG_ZPI_BW, ZPI_BW
        return LOC_BW

    def link(self, a: str, b: str, bandwidth: float, link: str) -> None:
        """Add a link; a second one between the same nodes joins it (bandwidths summed,
        the faster one's type kept): a ccsim graph has one edge per pair."""
        key = frozenset((a, b))
        entry = self.links.get(key)
        if entry is None:
            self.links[key] = {"ends": [a, b], "bandwidth": bandwidth, "link": link}
            return
        if bandwidth > entry["bandwidth"]:
            entry["link"] = link
        entry["bandwidth"] += bandwidth

    def nic_section(self) -> tuple[dict[str, Any] | None, str]:
        """The preset's ``nic`` section for the fastest NICs, and a note on the others."""
        if not self.nets:
            return None, ""
        best = max(net.speed for net in self.nets)
        kept = sorted((net for net in self.nets if net.speed == best), key=lambda net: net.dev)
        first = kept[0]
        second = next((n for n in kept if (n.pcie, n.latency) != (first.pcie, first.latency)), None)
        if second is not None:
            raise TopologyError(
                f"{self.where(second.element)} (dev {second.dev}) differs from line "
                f"{first.element.line} (dev {first.dev}) in its PCIe link or latency; a "
                "preset's NICs are identical: make them agree"
            )
        nic: dict[str, Any] = {
            "bandwidth": best,
            "attach": [net.host for net in kept],
            "link": "rdma",
            "latency": first.latency,
        }
        if first.pcie is not None:
            nic["pcie"] = {"bandwidth": first.pcie}
        dropped = len(self.nets) - len(kept)
        note = f" ({dropped} slower NIC port(s) left out)" if dropped else ""
        return nic, note


def _pci_type(value: str) -> str:
    """NCCL's node type for a PCI class, prefix-matched as kvConvertToInt does
    (kvDictPciClass, topo.cc:538-544; xml.h:428)."""
    for prefix, kind in (
        ("0x060400", "pci"),
        ("0x080100", "pci"),
        ("0x068000", "nvswitch"),
        ("0x068001", "cpu"),
        ("0x03", "gpu"),
        ("0x02", "nic"),
    ):
        if value.startswith(prefix):
            return kind
    return "pci"  # NCCL's fallback


def _holds_device(element: Element) -> bool:
    """Whether a GPU of the job or a NIC sits somewhere below ``element``."""
    for child in element.children:
        if child.tag == "nic" or (child.tag == "gpu" and "rank" in child.attrs):
            return True
        if child.tag == "pci" and _holds_device(child):
            return True
    return False


def _model(pci: Element) -> str | None:
    """The GPU model a ``<pci>``'s vendor and device ids name, if :data:`GPU_MODELS` has it."""
    try:
        vendor = int(pci.attrs.get("vendor", ""), 16)
        device = int(pci.attrs.get("device", ""), 16)
    except ValueError:
        return None
    return GPU_MODELS.get(device) if vendor == NVIDIA else None
