# The settings of the developers' knobs (docs/dev/cupti.md) that bench/gpu_decompose.sh
# (2 GPUs) and bench/gpu_self_decompose.sh (1 GPU) run one process per; sourced.
#   default         host records + NCCL's profiler events + CUPTI kinds + launch callbacks
#   no-kinds        ... without CUPTI's activity kinds (ZCTA_CUPTI_KINDS=none)
#   copies-only     ... with the memcpy/memset kinds only, no kernel records
#   no-callbacks    ... without CUPTI's launch callbacks (ZCTA_CUPTI_CALLBACKS=0)
#   nccl-mask-0     ... with the plugin loaded but asking NCCL for no events (ZCTA_NCCL_MASK=0)
#   host-only       no CUPTI (ZCTA_CUPTI=0): host records + NCCL's events
#   host-no-plugin  ZCTA_CUPTI=0 ZCTA_NCCL_PLUGIN=0: host records only
#   sampled         the default, with full detail only 100 ms of every 1 s (ZCTA_SAMPLE=100ms/1s)
#   between-windows what runs outside a sampling window, all the time (one 50 ms window a
#                   day, at 00:00 UTC): host records, CUPTI's launch callbacks, the plugin
#                   with NCCL's mask at 0; no kinds, no events, no marking
#   between-no-callbacks  between-windows without the launch callbacks (ZCTA_CUPTI_CALLBACKS=0)
#   host-mask-0     ZCTA_CUPTI=0 ZCTA_NCCL_MASK=0: host records + the plugin loaded, no events
#   gpu-ready       the default with every op timed with CUDA events (gpu_ready_ns for
#                   every op): ZCTA_BUDGET=all
# Whether setting NAME is among SETTINGS (a comma-separated list; unset: all).
selected() { [[ -z "${SETTINGS:-}" || ",$SETTINGS," == *",$1,"* ]]; }
# shellcheck disable=SC2034
names=(default no-kinds copies-only no-callbacks nccl-mask-0 host-only host-no-plugin sampled between-windows
       between-no-callbacks host-mask-0 gpu-ready)
# shellcheck disable=SC2034
envs=("" "ZCTA_CUPTI_KINDS=none" "ZCTA_CUPTI_KINDS=memcpy,memcpy2,memset" "ZCTA_CUPTI_CALLBACKS=0"
      "ZCTA_NCCL_MASK=0" "ZCTA_CUPTI=0" "ZCTA_CUPTI=0 ZCTA_NCCL_PLUGIN=0" "ZCTA_SAMPLE=100ms/1s"
      "ZCTA_SAMPLE=50ms/1440min" "ZCTA_SAMPLE=50ms/1440min ZCTA_CUPTI_CALLBACKS=0"
      "ZCTA_CUPTI=0 ZCTA_NCCL_MASK=0" "ZCTA_BUDGET=all")
