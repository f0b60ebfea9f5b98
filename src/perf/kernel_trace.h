// The GPU's kernel timeline of a traced range (DSINFER_KERNEL_TRACE=FILE): every kernel's start
// and end as CUPTI's activity records give them, also inside replayed CUDA graphs and with
// programmatic dependent launches overlapping, written as CSV when the range ends
// (tools/bench/kernel_trace.py reduces it to each kernel's share of the step). Kernels measured
// one by one (ncu) sum to more than a replayed step and say nothing of what overlaps; this is
// the step as it runs.
//
// libcupti is loaded at run time (dlopen: DSINFER_CUPTI_LIB, else the CUDA toolkit's and the
// usual library names), so a build needs only the CUDA headers and a run without the variable
// never touches CUPTI.
#pragma once

#include "base/status.h"

namespace dsinfer::perf {

// True when DSINFER_KERNEL_TRACE is set (the traced range then records kernels).
bool kernel_trace_requested();

// Starts recording kernels (no-op unless requested). Fails with a message when CUPTI cannot be
// loaded or refuses the activity kind.
Status kernel_trace_begin();

// Stops recording, waits for the records and writes them to the file DSINFER_KERNEL_TRACE names
// (CSV: range,name,start_ns,end_ns,stream,correlation,graph,graph_node,grid,block; one row per
// kernel; the process's first range truncates the file, later ranges append with their number).
// No-op unless requested and begun.
Status kernel_trace_end();

}  // namespace dsinfer::perf
