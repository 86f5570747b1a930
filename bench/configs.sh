# The benches' configurations, one place for bench/always_on.sh and bench/sr_ab.sh
# (sourced). `config_env CONFIG SHIM_DIR` sets `env_args` to what a process of CONFIG
# runs with: a name with a trailing digit N (e.g. default2) runs the build in the
# directory $SHIMN, when it is set. Returns 1 for an unknown name.
config_env() {
  local c=$1 bin=$2 base=$1 d=${1: -1} v
  case $d in
    [2-9])
      v=SHIM$d
      if [ -n "${!v:-}" ]; then
        bin=$(cd "${!v}" && pwd)
        base=${c%"$d"}
      fi
      ;;
  esac
  local so=$bin/libzcta_prof.so
  case $base in
    plain | profiler) env_args=() ;;
    default) env_args=(LD_PRELOAD="$so") ;;
    deep) env_args=(LD_PRELOAD="$so" ZCTA_GPU=deep) ;;
    off) env_args=(LD_PRELOAD="$so" ZCTA_GPU=off) ;;
    # Decomposition: host rows only (NCCL asked for no events), NCCL never loads our
    # plugin, the shim loaded but off.
    nomask) env_args=(LD_PRELOAD="$so" ZCTA_GPU=off ZCTA_NCCL_MASK=0) ;;
    noplugin) env_args=(LD_PRELOAD="$so" ZCTA_GPU=off ZCTA_NCCL_PLUGIN=0) ;;
    disabled) env_args=(LD_PRELOAD="$so" ZCTA_ENABLE=0) ;;
    # The budget's two ends: every op timed (with NCCL's events), almost none; and half
    # the default.
    all) env_args=(LD_PRELOAD="$so" ZCTA_BUDGET=all) ;;
    tiny) env_args=(LD_PRELOAD="$so" ZCTA_BUDGET=0.001%) ;;
    half) env_args=(LD_PRELOAD="$so" ZCTA_BUDGET=0.5%) ;;
    # The default's timing and checks without NCCL's events (its mask 0 from the start).
    events0) env_args=(LD_PRELOAD="$so" ZCTA_NCCL_MASK=0) ;;
    *) return 1 ;;
  esac
}
