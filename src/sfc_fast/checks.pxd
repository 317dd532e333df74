# The checks of one recipe element's fields, shared by the compiler's phases.

from libc.stdint cimport int32_t, int64_t
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

# Where each field of an element lands in the array Checker.*_fields fill. Description
# first, the v1.1.0 fields of an action last.
cdef enum:
    F_DESC = 0
    F_NAME = 1
    F_INITIAL = 2
    F_SOURCE = 1
    F_TARGET = 2
    F_CONDITION = 3
    F_PRIORITY = 4
    F_STEP = 2
    F_QUALIFIER = 3
    F_INTERACTION = 4
    F_TYPE_ID = 5
    F_TIMEOUT = 6
    F_PARAMETERS = 7
    F_N_V100 = 8        # the action fields before the v1.1.0 ones
    F_MAX = 16


cdef inline bint is_int(object v) noexcept:
    return type(v) is int or (isinstance(v, int) and not isinstance(v, bool))


cdef inline bint is_str(object v) noexcept:
    return isinstance(v, str)


cdef inline object get(object d, str key, object default=None):
    """d.get(key, default), without the method call for a plain dict."""
    cdef PyObject* v
    if type(d) is dict:
        v = PyDict_GetItem(d, key)
        return default if v == NULL else <object>v
    return d.get(key, default)


cdef inline object val(PyObject* p):
    return None if p == NULL else <object>p


# A JSON path "base[i]suffix" (base + suffix when i < 0), built only for a problem.
cdef str at(str base, Py_ssize_t i, str suffix)


cdef class Checker:
    cdef int minor
    cdef list problems
    # what v110 found for the action at hand
    cdef object v_hold
    cdef object v_restart
    cdef object v_subject
    cdef object v_corr
    cdef int64_t v_hold_timeout
    cdef int64_t v_duration
    cdef int32_t v_retries
    # per element kind, the key objects of this document that named each field
    cdef list seen_step, seen_transition, seen_action

    cdef void err(self, str code, str path, str message)
    cdef list list_of(self, dict obj, str key, str path, bint required)
    cdef int unknown_keys(self, dict obj, frozenset allowed, str base,
                          Py_ssize_t idx) except -1
    cdef int step_fields(self, dict st, Py_ssize_t i, PyObject** out, list keep) except -1
    cdef int transition_fields(self, dict tr, Py_ssize_t i, PyObject** out,
                               list keep) except -1
    cdef int action_fields(self, dict a, Py_ssize_t i, PyObject** out, list keep) except -1
    cdef object name(self, object v, str base, Py_ssize_t idx, str what)
    cdef object text(self, object v, str base, Py_ssize_t idx, str suffix, str what)
    cdef object seconds(self, object v, str key, str base, Py_ssize_t idx, str code,
                        bint allow_float)
    cdef void v110(self, dict a, Py_ssize_t ai, int qual, int inter, int64_t timeout,
                   int n_v110)

    # private
    cdef void _description(self, object d, str base, Py_ssize_t idx)
    cdef int _fields(self, dict obj, tuple fields, dict index, list seen,
                     Py_ssize_t n_allowed, frozenset allowed, str base, Py_ssize_t idx,
                     PyObject** out, list keep) except -1
    cdef void _hold(self, dict a, Py_ssize_t ai, int inter, int64_t timeout)
    cdef void _match(self, object m, Py_ssize_t ai, int inter)
