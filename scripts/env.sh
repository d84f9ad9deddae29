# Sourced by the scripts here: XLA:CPU's allocator setting, which glibc reads only when a
# process starts (why, and DYNJAX_MALLOC's choices: dynjax/runtime.py, whose values these
# are; train.py and audit.py also apply it themselves when run directly). Idempotent.
case "${DYNJAX_MALLOC:-hugetlb}" in
  retain) _dynjax_tunables="glibc.malloc.hugetlb=1 glibc.malloc.mmap_max=0 glibc.malloc.trim_threshold=17179869184" ;;
  hugetlb) _dynjax_tunables="glibc.malloc.hugetlb=1" ;;
  *) _dynjax_tunables="" ;;
esac
for _t in $_dynjax_tunables; do
  case ":${GLIBC_TUNABLES:-}:" in
    *":$_t:"*) ;;
    *) export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}$_t" ;;
  esac
done
unset _dynjax_tunables _t
