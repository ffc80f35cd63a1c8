// knob_table.h: every environment variable chorus reads, with its default and meaning: the one
// place that declares them. config.cc reads the runtime's (the first Knob::kCount entries, in the
// order of the Knob enum); the other groups name variables read where they apply (launchers in
// api.cc and launcher.cc, the CPU kernels, the training layer). tools/chorus_knobs.cc prints the
// table as docs/knobs.md, and the knobs test checks that page and that every variable the
// sources read is here.
#pragma once

namespace chorus {

struct KnobSpec {
  const char* name;
  const char* defaultValue;
  const char* meaning;
  const char* group = "runtime";  // the section of docs/knobs.md
};

inline constexpr KnobSpec kKnobs[] = {
    {"CHORUS_DEBUG", "WARN", "log level: WARN, INFO or TRACE"},
    {"CHORUS_TRANSPORT", "auto", "auto (shm within a host, ucx across), or shm, tcp or ucx for every peer"},
    {"CHORUS_CONNECT", "lazy",
     "lazy: a rank connects to a peer (shm FIFOs, a tcp socket, a UCX endpoint) when its first message to or from "
     "that peer is posted, so it holds connections only to the peers its algorithms use (a ring: two); eager: to "
     "every peer at init (n-1 per rank)"},
    {"CHORUS_TIMEOUT_MS", "300000", "an operation fails when nothing has moved for this long (ms)"},
    {"CHORUS_INIT_TIMEOUT_MS", "120000", "how long init waits for every rank to arrive"},
    {"CHORUS_CHUNK_BYTES", "524288",
     "pipelining chunk of every call, bytes; unset, the tuner picks it per call (64 KiB to 4 MiB; on shm at most "
     "half a FIFO), and the default is the size assumed where no call decides"},
    {"CHORUS_SHM_SLOT_BYTES", "262144", "bytes per shared-memory FIFO slot (rounded down to a multiple of 64)"},
    {"CHORUS_SHM_SLOTS", "8", "slots per shared-memory FIFO (one FIFO per ordered pair of ranks)"},
    {"CHORUS_SHM_READ_BYTES", "0",
     "shm messages of at least this many bytes are read by the receiver straight from the sender's memory "
     "(process_vm_readv: one copy instead of two); 0: never. Where ranks may not read each other's memory "
     "(another PID namespace, ptrace restrictions) the pair keeps two copies, logged at INFO"},
    {"CHORUS_SHM_MAP_BYTES", "65536",
     "shm messages of at least this many bytes whose buffer lies in a chorusMemAlloc allocation are copied by the "
     "receiver straight from the sender's pages, mapped (one copy at memory speed); 0: never. Where a rank may not "
     "take its peer's descriptors (pidfd_getfd: another PID namespace, ptrace restrictions) the pair keeps two "
     "copies, logged at INFO"},
    {"CHORUS_SHM_DIRECT_BYTES", "65536",
     "the tuner weighs the direct algorithm for blocking all-reduces and reduce-scatters with at least this many "
     "input bytes among ranks all on shm (where every rank's buffers lie in chorusMemAlloc allocations, each reduces "
     "straight from every rank's input into the outputs); 0: never, unless CHORUS_ALGO forces it"},
    {"CHORUS_SPIN_US", "20", "how long a wait spins before it blocks (ranks may outnumber cores)"},
    {"CHORUS_BOOTSTRAP_ADDR", "", "IP address to listen on (default: chosen by CHORUS_SOCKET_IFNAME)"},
    {"CHORUS_SOCKET_IFNAME", "",
     "interfaces to listen on: name prefixes, comma-separated; ^ excludes them, = matches whole names (default: the "
     "first interface that is up and not loopback, else loopback), as NCCL_SOCKET_IFNAME: eth,ib or ^docker,lo or "
     "=eth0. A name that matches nothing fails init, listing the interfaces there are"},
    {"CHORUS_ALGO", "",
     "algorithm per collective, e.g. allreduce:ring,allgather:bruck; on device buffers direct, ipc or staged "
     "(default: chosen per call)"},
    {"CHORUS_TUNING_FILE", "", "tuner cost parameters per transport (lines: shm alpha_us=5 beta_GBps=5 ...)"},
    {"CHORUS_RANK_ORDER", "",
     "order in which rings, chains and trees visit the ranks, e.g. 0,2,1,3 (default 0..n-1; used by "
     "communicators of that many ranks)"},
    {"CHORUS_DUMP_SIGNAL", "0",
     "1: SIGUSR1 makes every communicator of the process print its pending operations, the step each waits on "
     "and what each link has moved (as chorusCommDumpState), the next time a call of it waits"},
    {"CHORUS_CHECK_CALLS", "1",
     "1: before a rooted collective (broadcast, reduce, gather, scatter) runs, the ranks agree that they made the "
     "same call (collective, count, type, op, root, algorithm, rank order), in ceil(log2 n) small messages, and all "
     "fail, naming two ranks' calls, where they did not; 0: skip that (ranks that disagree, on the root for one, may "
     "then return wrong data as success)"},
    {"CHORUS_DETERMINISTIC", "0",
     "1: all-reduce, reduce-scatter and reduce fold every element in rank order (rank 0's value, then rank 1's, "
     "...), so their bits depend on the rank count alone, not on the algorithm, chunk size, transport, timing or "
     "placement: every rank's contribution goes to the rank that owns the block (the ordered reduction, "
     "docs/algorithms.md), or the direct algorithm, which folds that way already; on device buffers the ipc ring "
     "is not used for them. 0: the algorithms reduce as they go"},
    {"CHORUS_TRACE_DIR", "",
     "folder where each rank keeps the record of its communicators' last operations (the flight recorder: call, "
     "algorithm, bytes, start and end, what it waits on, per link what moved), as "
     "chorus-trace-<comm>-rank<r>.json, written when a call fails (timeout, a peer's failure, mismatch, abort), on "
     "SIGUSR1 while a call waits, and at destroy; `chorus-trace DIR` says from them which rank or call a hang or "
     "failure comes from. Unset: no record"},
    {"CHORUS_TRACE_OPS", "100", "operations each communicator's flight recorder keeps (CHORUS_TRACE_DIR)"},
    {"CHORUS_STATS", "1",
     "1: each communicator counts per collective and size bucket its calls, bytes, time and algorithms, and per "
     "peer the bytes each way and the time it waited on that peer (chorusCommGetStats, CHORUS_STATS_FILE); 0: "
     "not (no clock is read per call)"},
    {"CHORUS_STATS_FILE", "",
     "file each rank writes its communicators' statistics to at destroy (and every CHORUS_STATS_INTERVAL_S): %r the "
     "rank, %c the communicator id, %p the process id; Prometheus' text format where the name ends in .prom, else "
     "JSON"},
    {"CHORUS_STATS_INTERVAL_S", "0",
     "also write CHORUS_STATS_FILE at the end of the first call this many seconds after the last write (0: only at "
     "destroy)"},
    {"CHORUS_BIND", "auto",
     "auto: bind each process to a CPU node of its host (local ranks in blocks over the NUMA nodes) unless a "
     "launcher bound it; none: leave it"},
    {"CHORUS_TOPO_FILE", "",
     "topology file (chorus, hwloc or NCCL XML) read instead of discovering the machine, for chorus-topo, binding "
     "and the rank order; a cluster file's host is the one of this host name, else the communicator's host number "
     "modulo the file's hosts"},
    {"CHORUS_TCP_RATE_LIMIT", "",
     "rate each rank may send at over the tcp connections of one communicator, all its peers together, e.g. 50mbit or "
     "1gbit (bit, kbit, mbit, gbit; "
     "headers count; a token bucket of 2 ms, at least 16 KiB): a slow link emulated in user space (default: "
     "unlimited)"},
    {"CHORUS_TCP_DELAY", "",
     "latency added to every tcp message before its first byte leaves, e.g. 5ms (us, ms, s; default: none)"},
    {"CHORUS_COMPRESS", "",
     "compressor of compressed all-reduces created without one, e.g. powersgd:4 or topk:0.01 (names: none, fp16, "
     "bf16, powersgd, topk, randomk, qsgd, sign; default: none)"},
    {"CHORUS_DEVICE_TRANSPORT", "auto",
     "how collectives on device buffers move data: direct (ranks sharing one GPU: each publishes its input in a "
     "buffer the others map with CUDA IPC, the streams are ordered by flags in shared host memory, and each rank's own kernels read "
     "what it needs; no kernel waits on another process), ipc (ring kernels that read and write the peers' GPU "
     "memory, mapped with CUDA IPC; every rank on one host), staged (through pinned host buffers and the host "
     "transports, any ranks), auto (direct where every rank shares one GPU, else ipc where every rank can, else "
     "staged; a call being captured in a CUDA graph takes ipc or staged)"},
    {"CHORUS_DEVICE_LL_BYTES", "65536",
     "device calls whose per-rank buffer is at most this many bytes use the low-latency protocol (flags in line "
     "with the data); larger ones the bulk protocol"},
    {"CHORUS_DEVICE_CHANNELS", "8", "channels (thread blocks) of a bulk-protocol device call, 1 to 16"},
    {"CHORUS_DEVICE_THREADS", "512", "threads per channel of a device call, 32 to 1024, a multiple of 32"},
    {"CHORUS_DEVICE_STAGE_BYTES", "4194304",
     "chunk of the staged device path: the device-to-host copy of one chunk overlaps the transfer of the one "
     "before"},
    {"CHORUS_DEVICE_DIRECT_BYTES", "33554432",
     "bytes of each of the two buffers in which a rank of the direct device path publishes its input; larger calls "
     "go in pieces of this size"},
    {"CHORUS_DEVICE_DIRECT_INPLACE_BYTES", "16777216",
     "direct device all-reduces of at least this many bytes per rank read the ranks' buffers where they lie (CUDA "
     "IPC handles of the callers' allocations, mapped once each), each rank reducing its block of every input into "
     "that block of every output, instead of publishing a copy; 0: never. The default is where it first won on an "
     "H100 with MPS (16 MiB on 2 ranks: 103-109 us against 181-183) and came within a tenth without"},
    {"CHORUS_DEVICE_STAGED_POST", "value",
     "how a staged device call reaches the proxy thread and back: host (a host function, then a one-thread kernel "
     "that waits) or value (the stream writes the call's number into pinned memory and waits on another, no "
     "kernel; on an H100 the faster for calls of up to 256 KiB, from 24% slower to 39% faster for larger ones; "
     "where the driver lacks stream memory operations the default falls back to host). Calls being captured in a "
     "graph always use host"},
    {"CHORUS_DEVICE_DIRECT_REDUCERS", "all",
     "who reduces a direct device all-reduce read in place: all (each rank its block of every input into that "
     "block of every output; two waits across processes per call) or one (rank 0 the whole call into every output, "
     "in one kernel; one wait per rank: rank 0 for the others' inputs, they for its kernel). Without MPS the ranks "
     "take turns on the GPU and each wait on another process costs a turn. Rank 0's setting holds for all"},

    // Launchers (chorusCommInitFromEnv; the CHORUS_ spellings win over the plain ones).
    {"CHORUS_RANK", "", "this process's rank (also RANK, as torchrun sets it)", "launcher"},
    {"CHORUS_WORLD_SIZE", "", "the number of ranks (also WORLD_SIZE)", "launcher"},
    {"CHORUS_MASTER_ADDR", "",
     "address of rank 0, which hosts the bootstrap root (also MASTER_ADDR; under srun: the step's first node)",
     "launcher"},
    {"CHORUS_MASTER_PORT", "",
     "port of the bootstrap root (also MASTER_PORT; under srun, unset: derived from SLURM_JOB_ID and SLURM_STEP_ID)",
     "launcher"},
    {"CHORUS_SECRET", "",
     "shared by every rank of a job, so a stray process cannot join (chorusrun sets one per job; under srun, unset: "
     "derived from the job and step ids)",
     "launcher"},
    // Kernels.
    {"CHORUS_CPU_ISA", "",
     "caps the host reductions' instruction set: scalar, avx2 or avx512 (default: the best "
     "the CPU has)",
     "kernels"},
    // Training layer (chorus-train).
    {"CHORUS_TRAIN_PEAK_GFLOPS", "",
     "set by chorus-train's launcher for its ranks: the GEMM peak (GFLOP/s) against which they report model FLOPs "
     "utilisation",
     "training"},
    {"CHORUS_TRAIN_PEAK_SOURCE", "",
     "set by chorus-train's launcher for its ranks: where that peak came from (declared, calibrated or measured)",
     "training"},
    {"CHORUS_TRAIN_PEAK_WHERE", "", "set by chorus-train's launcher for its ranks: a calibrated peak's file and date",
     "training"},
    {"CHORUS_CALIBRATION", "",
     "chorus-train's calibration file of GEMM peaks per machine and precision (chorus-train --calibrate writes it; "
     "unset: $XDG_CACHE_HOME/chorus/gemm-peaks.json, else ~/.cache/chorus/gemm-peaks.json)",
     "training"},
    {"CHORUS_TRAIN_COMM_DELAY_MS", "0",
     "test hook: a pause before each data-parallel gradient bucket and each chunked MoE exchange is sent (a slow "
     "link, for the in-flight cap and overlap tests)",
     "training"},
    {"CHORUS_TRAIN_BACKWARD_DELAY_MS", "0",
     "test hook: a pause in backward after each unit's gradients are final, but the micro-batch's last (slow "
     "compute, so that reductions and the step during backward run ahead of it; the offload test's overlap check)",
     "training"},
    {"CHORUS_TRAIN_STRAGGLER_MS", "0",
     "emulated straggler: each training step, data-parallel rank (step mod dp ranks) pauses this long before its "
     "first micro-batch (to compare every-step data parallelism with local SGD and DiLoCo)",
     "training"},
    {"CHORUS_TRAIN_CRASH_IN_SAVE", "-1",
     "test hook: the step whose checkpoint the process dies half-way through writing (the checkpoint test)",
     "training"},
};

// The runtime's knobs (config.h's Knob enum) come first.
inline constexpr int kRuntimeKnobs = [] {
  int n = 0;
  for (const KnobSpec& k : kKnobs) {
    if (k.group[0] != 'r') break;
    ++n;
  }
  return n;
}();

}  // namespace chorus
