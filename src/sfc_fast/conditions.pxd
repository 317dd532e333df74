# The condition language: compiled to int32 bytecode at recipe compile time,
# run by a small stack machine. Shared C declarations for the recipe compiler
# and for evolve.

from libc.stdint cimport int32_t

# Opcodes. Operands follow inline in the code array.
cdef enum:
    OP_END = 0
    OP_CONST = 1        # CONST k: push constant k
    OP_LOAD = 2         # LOAD r: push the value of reference r
    OP_EQ = 3
    OP_NE = 4
    OP_LT = 5
    OP_LE = 6
    OP_GT = 7
    OP_GE = 8
    OP_IN = 9
    OP_NOT = 10
    OP_AND_JUMP = 11    # AND_JUMP a: top falsy -> replace with False, jump to a; else pop
    OP_OR_JUMP = 12     # OR_JUMP a: top truthy -> replace with True, jump to a; else pop
    OP_BOOL = 13        # replace top with its truth value
    OP_LIST = 14        # LIST n: pop n values, push a list
    OP_NEG = 15         # arithmetic negation of a number (null otherwise)
    OP_COUNT = 16

# Kinds of reference (a name in a condition).
cdef enum:
    REF_RESULT = 0      # action.field.sub: a result field of a named action
    REF_ROUND = 1       # action._round
    REF_OUTCOME = 2     # action._outcome
    REF_JOB = 3         # job.param.sub: a job parameter
    REF_BARE = 4        # name.sub: results of the source step's actions, newest first, then job params

# Guard against pathological nesting in untrusted recipes.
cdef enum:
    MAX_DEPTH = 64
    MAX_STACK = 256


cdef class CondContext:
    """Resolves references while a condition runs; evolve subclasses it."""
    cdef object load(self, int32_t ref)


cdef object run_condition(const int32_t* code, Py_ssize_t start, Py_ssize_t end,
                          list consts, CondContext ctx)
cdef bint truthy(object v) except -1
cdef bint values_equal(object a, object b) except -1
cdef int verify_code(const int32_t* code, Py_ssize_t start, Py_ssize_t end,
                     Py_ssize_t n_consts, Py_ssize_t n_refs) noexcept
