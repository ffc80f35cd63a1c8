#!/usr/bin/env python3
# variants.py: the hwloc XML variants of pcie-2socket-8gpu.hwloc.xml that topology_test reads:
# an NVSwitch server (hwloc's NVLinkBandwidth distances from each GPU's NVML device to two switch
# ports), a POWER-style server (GPUs paired by NVLink and NVLinked to their package), and an
# lstopo --whole-io view (a BMC display controller; GPUs seen as CUDA, OpenCL, NVML and DRM devices).
# Run it to write them beside it.
import re
import os
D = os.path.dirname(os.path.abspath(__file__)) + '/'
base = open(D + 'pcie-2socket-8gpu.hwloc.xml').read()

def add_osdevs(text, extra):
    # extra(k) -> list of OSDev lines for GPU k, put after its cuda OSDev
    def rep(m):
        k = int(m.group(2))
        return m.group(0) + ''.join('\n' + m.group(1) + line for line in extra(k))
    return re.sub(r'( *)<object type="OSDev" gp_index="\d+" name="cuda(\d)" subtype="CUDA" osdev_type="5"/>', rep, text)

def distances(objs, value):
    n = len(objs)
    idx = ' '.join(objs) + ' '
    vals = []
    for i in range(n):
        for j in range(n):
            vals.append(str(value(i, j)))
    body = '    <indexes length="%d">%s</indexes>\n' % (len(idx), idx)
    # rows of values, as lstopo writes them (several u64values elements)
    for r in range(0, n * n, 10):
        chunk = ' '.join(vals[r:r + 10]) + ' '
        body += '    <u64values length="%d">%s</u64values>\n' % (len(chunk), chunk)
    return '  <distances2hetero nbobjs="%d" kind="25" name="NVLinkBandwidth">\n%s  </distances2hetero>\n' % (n, body)

nvml = lambda k: ['<object type="OSDev" gp_index="%d" name="nvml%d" subtype="NVML" osdev_type="1"/>' % (200 + k, k)]

# An NVSwitch server: eight GPUs, each with 18 NVLinks (450 GB/s) into two NVSwitch ports of
# 225 GB/s each, as hwloc's NVML backend writes the matrix before merging the ports.
t = add_osdevs(base, nvml).replace('value="pcie-8gpu"', 'value="nvswitch-8gpu"')
switch = '''      <object type="Bridge" gp_index="300" bridge_type="0-1" depth="0" bridge_pci="0000:[40-42]">
        <object type="Bridge" gp_index="301" bridge_type="1-1" depth="1" bridge_pci="0000:[41-42]" pci_busid="0000:40:00.0" pci_type="0604 [1000:c030] [0000:0000] 00" pci_link_speed="1.000000">
          <object type="PCIDev" gp_index="302" subtype="NVSwitch" pci_busid="0000:41:00.0" pci_type="0680 [10de:22a3] [0000:0000] a1" pci_link_speed="1.000000"/>
          <object type="PCIDev" gp_index="303" subtype="NVSwitch" pci_busid="0000:42:00.0" pci_type="0680 [10de:22a3] [0000:0000] a1" pci_link_speed="1.000000"/>
        </object>
      </object>
'''
i = t.index('      <object type="Bridge" gp_index="21"')
t = t[:i] + switch + t[i:]
objs = ['OSDev:%d' % (200 + k) for k in range(8)] + ['PCIDev:302', 'PCIDev:303']
def v(i, j):
    if i == j: return 1000000
    if (i < 8) != (j < 8): return 225000
    return 0
t = t.replace('  </object>\n</topology>', '  </object>\n' + distances(objs, v) + '</topology>')
open(D + 'nvswitch-2socket-8gpu.hwloc.xml', 'w').write(t)

# A POWER-style server: GPUs paired by NVLink (gpu0-gpu1, gpu2-gpu3, ...), each GPU also NVLinked
# to its own package, 80 GB/s each (more than the GPUs' PCIe links); the PCIe tree stays.
t = add_osdevs(base, nvml).replace('value="pcie-8gpu"', 'value="nvlink-cpu-8gpu"')
objs = ['OSDev:%d' % (200 + k) for k in range(8)] + ['Package:2', 'Package:34']
def v(i, j):
    if i == j: return 1000000
    if i < 8 and j < 8: return 80000 if i // 2 == j // 2 else 0
    g, p = (i, j) if i < 8 else (j, i)
    if g >= 8: return 0
    return 80000 if (g // 4) == (p - 8) else 0
t = t.replace('  </object>\n</topology>', '  </object>\n' + distances(objs, v) + '</topology>')
open(D + 'nvlink-cpu-2socket-8gpu.hwloc.xml', 'w').write(t)

# lstopo --whole-io: a BMC's display controller (no compute device) ahead of the GPUs, and every
# GPU seen as several OS devices (CUDA, OpenCL, NVML, its DRM card).
def many(k):
    return ['<object type="OSDev" gp_index="%d" name="opencl0d%d" subtype="OpenCL" osdev_type="5"/>' % (210 + k, k),
            '<object type="OSDev" gp_index="%d" name="nvml%d" subtype="NVML" osdev_type="1"/>' % (220 + k, k),
            '<object type="OSDev" gp_index="%d" name="card%d" osdev_type="1"/>' % (230 + k, k + 1)]
t = add_osdevs(base, many).replace('value="pcie-8gpu"', 'value="wholeio-8gpu"')
bmc = '''      <object type="Bridge" gp_index="310" bridge_type="0-1" depth="0" bridge_pci="0000:[02-03]">
        <object type="Bridge" gp_index="311" bridge_type="1-1" depth="1" bridge_pci="0000:[03-03]" pci_busid="0000:02:00.0" pci_type="0604 [1a03:1150] [0000:0000] 06" pci_link_speed="0.250000">
          <object type="PCIDev" gp_index="312" pci_busid="0000:03:00.0" pci_type="0300 [1a03:2000] [15d9:1b95] 52" pci_link_speed="0.250000">
            <info name="PCIVendor" value="ASPEED Technology, Inc."/>
            <info name="PCIDevice" value="ASPEED Graphics Family"/>
            <object type="OSDev" gp_index="313" name="card0" osdev_type="1"/>
          </object>
        </object>
      </object>
'''
i = t.index('      <object type="Bridge" gp_index="21"')
t = t[:i] + bmc + t[i:]
open(D + 'wholeio-2socket-8gpu.hwloc.xml', 'w').write(t)
