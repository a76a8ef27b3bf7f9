# Shared by msrun-rankwatch and torchrun-rankwatch (sourced, not run): the run name of a launch.
#
# rankwatch_run_name SCRIPT prints the run name for one launch of SCRIPT:
#   $RANKWATCH_RUN if already set (a multi-node launch sets it once, for every node);
#   else <script>-<job id> when a batch scheduler gave one (the same on every node of the job);
#   else <script>-<UTC date>-<time>-<random> (one launch on one node).

rankwatch_run_name() {
    if [ -n "${RANKWATCH_RUN:-}" ]; then
        printf '%s\n' "$RANKWATCH_RUN"
        return
    fi
    stem=$(basename -- "${1:-run}")
    stem=${stem%.py}
    job=${SLURM_JOB_ID:-${PBS_JOBID:-${LSB_JOBID:-}}}
    if [ -n "$job" ]; then
        [ -n "${SLURM_STEP_ID:-}" ] && job="$job.$SLURM_STEP_ID"
        name="$stem-$job"
    else
        rand=$(od -An -N3 -tx1 /dev/urandom 2>/dev/null | tr -d ' \n')
        [ -n "$rand" ] || rand=$$
        name="$stem-$(date -u +%Y%m%d-%H%M%S)-$rand"
    fi
    # Keep the name to what rankwatch accepts everywhere (and the filesystem likes).
    printf '%s\n' "$name" | tr -c 'A-Za-z0-9._\n-' '_' | cut -c1-200
}

# rankwatch_script ARGS... prints the training script among a launcher's arguments: the first
# one naming a Python file, or the module after -m (torchrun -m pkg.train); else "run".
rankwatch_script() {
    module=0
    for arg in "$@"; do
        if [ "$module" = 1 ]; then
            printf '%s\n' "${arg##*.}"
            return
        fi
        case $arg in
            -m | --module | --module=true) module=1 ;;
            *.py) printf '%s\n' "$arg"; return ;;
        esac
    done
    printf 'run\n'
}
