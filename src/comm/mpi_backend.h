// MPI backend (OpenMPI): the real engine, on one host or many, under `mpirun`.
//
// Threads: MPI is initialised with MPI_Init_thread asking for MPI_THREAD_MULTIPLE (whatever is
// provided is recorded; at least MPI_THREAD_SERIALIZED is required). Collectives are nonblocking
// (MPI_Iallreduce, ...); their Work makes progress inside is_completed()/wait() (OpenMPI progresses
// nonblocking collectives in MPI_Test), so calls on one Backend must not run concurrently.
// NOTE: there is no progress thread yet: overlap with compute needs the caller to poll
// is_completed() (a dedicated progress thread fed by a queue, c10d's way, is the next step).
//
// reduce_scatter is a ring of point-to-point messages on a communicator of its own (tag: the call's
// sequence number), not MPI_Ireduce_scatter_block: OpenMPI 4.1's libnbc reduces the whole buffer to
// rank 0 and scatters it from there, 2.0-3.1x the ring's time on 2 ranks from 16.8 to 498 MB
// (docs/PERF.md (q)). Block r is summed from rank r+1 round to r, r's own block last. Its steps
// advance whenever any MpiWork of the process is polled. MT_REDUCE_SCATTER=mpi (every rank) hands
// the calls back to MPI.
//
// bf16/f16 reductions: the buffer is widened to an f32 copy, reduced in f32 by MPI (MPI_SUM/MAX/MIN
// over MPI_FLOAT) and rounded once back to the element type when the Work completes; kAvg divides
// the f32 sum by the group size. So bf16 sums carry f32 rounding only, never per-hop bf16 rounding.
//
// Timeouts: every rank announces each collective it enters (sequence number and name) to group
// rank 0 with a small nonblocking message on a duplicated communicator; rank 0 reads them while it
// polls. A wait() past its deadline on rank 0 lists the ranks that have not announced the
// collective, sends that report to the ranks that did, and throws CommTimeout; on another rank
// wait() waits up to its timeout again for rank 0's report (no report: rank 0 itself is named).
// A timed-out collective cannot be cancelled in MPI: the job is meant to end, by abort().
#pragma once

#include <memory>

#include "comm/backend.h"

namespace mt::comm {

// Call first in main(), before any work: under an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE,
// PMIX_RANK or PMI_SIZE) the process execs itself again, once, with glibc's malloc told to back its
// large blocks with transparent huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, appended to any
// the user set). OpenMPI's collectives malloc temporary buffers the size of the message each call;
// above glibc's mmap threshold every call maps fresh memory and faults it in 4 KiB at a time, and
// on a virtual machine a fault costs ~18 us (a 32 MiB reduce_scatter_block took 170 ms instead of
// 12; a 2-rank DDP step's backward 640 ms instead of 315). With huge pages one fault maps 2 MiB.
// Nothing happens outside a launcher, when the tunable is already set, or if the exec fails.
void mpi_prepare_process(char** argv);
// True when this process runs with the tunable above (for tests).
bool mpi_malloc_huge_pages();

// Initialises MPI once per process (repeat calls return the same world) and returns the world
// group. Throws kIOError when MPI cannot give MPI_THREAD_SERIALIZED.
// Before MPI_Init it sets OMPI_MCA_coll_libnbc_iallreduce_algorithm=1 unless the environment (or
// mpirun --mca, which passes it on as that variable) already sets it: OpenMPI 4.1's libnbc gives
// every in-place MPI_Iallreduce, and any of fewer than 4 ranks, its binomial tree (the whole
// buffer reduced to rank 0, then broadcast), twice the blocking all-reduce's time at every size
// measured; its ring matches the blocking one (docs/PERF.md, "libnbc's ring by default").
std::shared_ptr<Backend> mpi_init(int* argc, char*** argv);
// The value libnbc runs with for coll_libnbc_iallreduce_algorithm (0 its own choice, 1 ring, ...),
// read through MPI's tool interface; -1 when it cannot be read. After mpi_init.
std::shared_ptr<Backend> mpi_init(int* argc, char*** argv);
int mpi_iallreduce_algorithm();
// The reduce_scatter path that MT_REDUCE_SCATTER gives: "ring" (the default) or "mpi". Throws
// kInvalidArgument for another value.
const char* mpi_reduce_scatter_path();
// The scratch the ring takes for one reduce_scatter of `size` ranks and blocks of block_bytes
// (count x element size), accounted as comm while the ring runs: none on 2 ranks, one block on 3
// or more; in place (recv inside send), a block on 2 and two on 3 or more.
size_t ring_reduce_scatter_scratch_bytes(int size, size_t block_bytes, bool in_place);
// The same on the path MT_REDUCE_SCATTER gives: 0 for "mpi" (MPI's own temporaries are not ours
// to account).
size_t reduce_scatter_scratch_bytes(int size, size_t block_bytes, bool in_place);
// How long a rank waiting on MPI sleeps between polls once a thousand polls, each a yield, found
// nothing (a pipeline stage's bubble, a rank ahead of the others at a collective): 50 us where its
// host has a core for each of its ranks' threads, 1 ms where it has fewer. OpenMPI's shared-memory
// transport only moves when polled, so a waiting rank cannot block in the kernel; but on a host with
// more threads than cores each wake of a waiting rank takes the core from one computing (the
// scheduler runs the woken task at once), and 20 000 wakes a second per waiting rank cost a 4-stage
// pipeline on 2 cores 10-15 % of its step (docs/PERF.md, "A waiting rank's naps"). Where every
// thread has its core the wake costs no one, and the shorter nap answers sooner.
int mpi_idle_sleep_us(int ranks_on_host, int threads, int cores);
// The cores this host's ranks may run on together (the union of their affinity masks, mpi_init's;
// before it, or without MPI, this process's: base's host_cores).
int mpi_host_cores();
// The sleep this process's waits take: mpi_init sets it from the ranks on this host (MPI's
// shared-memory split), OpenMP's threads and those cores (mpi_host_cores), or MT_WAIT_NAP_US (1 to 1 000 000;
// another value throws kInvalidArgument) where that is set; 50 before mpi_init.
int mpi_wait_sleep_us();
// Finalises MPI. REQUIRES: every Work has completed and every MPI Backend but the world is gone.
void mpi_finalize();
// The thread level MPI provided ("multiple", "serialized", ...); "none" before mpi_init.
const char* mpi_thread_level();

}  // namespace mt::comm
