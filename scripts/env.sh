# Sourced by the scripts here: XLA:CPU's allocator setting, which glibc reads only when a
# process starts (why, and DYNJAX_MALLOC's choices: dynjax/_alloc.py; train.py and audit.py
# also apply it themselves when run directly). Idempotent.
case "${DYNJAX_MALLOC:-hugetlb}:${GLIBC_TUNABLES:-}:" in
  hugetlb:*glibc.malloc.hugetlb=1:*) ;;
  hugetlb:*) export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" ;;
esac
