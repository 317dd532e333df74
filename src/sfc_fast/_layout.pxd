# The layout of a compiled recipe's bytes: written by the compiler (compiler.pyx),
# read back and checked by Graph (graph.pyx). The one place it is written down.
#
#   0   magic "SFCG"
#   4   uint16 format major, format minor, schema minor, 0
#   12  fingerprint (16 bytes): blake2b over everything from byte 28 on
#   28  int32 counts[N_COUNTS] (S, B, P, PS, T, A, C, K, R, RS, CN, NS, SB, initial)
#   88  the int32 tables (X_* order), padded to 8; the int64 tables; the UTF-8 strings

from libc.stdint cimport int32_t

cdef enum:
    GRAPH_FORMAT_MAJOR = 1
    GRAPH_FORMAT_MINOR = 0
    HEADER_SIZE = 88
    FINGERPRINT_AT = 12
    COUNTS_AT = 28
    N_COUNTS = 14

# Largest number of elements of one kind (steps, actions, transitions, branches).
cdef enum:
    MAX_ELEMENTS = 100000
    MAX_COUNT = 64 * MAX_ELEMENTS      # bound of any header count read back

# The int32 tables of the blob, in blob order. The compiler fills one growable C
# vector per table; packing is a memcpy per table.
cdef enum:
    X_STEP_NAME
    X_STEP_FLAGS
    X_STEP_PATH
    X_STEP_ACT_OFF
    X_STEP_ACTS
    X_NODE_OUT_OFF
    X_NODE_OUT
    X_TR_SRC
    X_TR_DST
    X_TR_PRIO
    X_TR_COND
    X_TR_KIND
    X_TR_TEXT
    X_A_NAME
    X_A_STEP
    X_A_QUAL
    X_A_INTER
    X_A_TYPE
    X_A_PARAMS
    X_A_HOLD
    X_A_RESTART
    X_A_RETRIES
    X_A_SUBJ
    X_A_CORR
    X_A_RESET
    X_B_NAME
    X_B_TYPE
    X_B_PATH_OFF
    X_PATH_BRANCH
    X_PATH_OFF
    X_PATH_STEPS
    X_COND_OFF
    X_CODE
    X_REF_KIND
    X_REF_ACTION
    X_REF_SEG_OFF
    X_REF_SEGS
    X_CONST_TEXT
    X_STR_OFF
    N_I32

# int64 tables (one entry per action), after the int32 ones.
cdef enum:
    X_A_TIMEOUT
    X_A_HOLD_TIMEOUT
    X_A_DURATION
    N_I64


cdef inline Py_ssize_t table_lengths(const int32_t* c, Py_ssize_t* out) noexcept:
    """Lengths of the int32 tables, in blob order, from the header counts; returns
    their sum."""
    cdef int32_t S = c[0], B = c[1], P = c[2], PS = c[3], T = c[4], A = c[5], C = c[6]
    cdef int32_t K = c[7], R = c[8], RS = c[9], CN = c[10], NS = c[11]
    cdef Py_ssize_t k, total = 0
    out[:N_I32] = [S, S, S, S + 1, A,
                   S + B + 1, T,
                   T, T, T, T, T, T,
                   A, A, A, A, A, A, A, A, A, A, A, A,
                   B, B, B + 1,
                   P, P + 1, PS,
                   C + 1, K, R, R, R + 1, RS, CN,
                   NS + 1]
    for k in range(N_I32):
        total += out[k]
    return total


cdef inline Py_ssize_t i64_at(Py_ssize_t n32) noexcept:
    """Where the int64 tables start after n32 int32 entries: aligned to 8."""
    cdef Py_ssize_t off = HEADER_SIZE + 4 * n32
    return off + (8 - off % 8) % 8
