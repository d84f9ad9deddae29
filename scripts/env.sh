# Sourced by the scripts here: XLA:CPU's allocator setting, which glibc reads only when a
# process starts (why: dynjax/_alloc.py; train.py, audit.py and train_mlp.py also set it
# themselves when run directly). Idempotent.
case ":${GLIBC_TUNABLES:-}:" in
  *:glibc.malloc.hugetlb=1:*) ;;
  *) export GLIBC_TUNABLES="${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1" ;;
esac
