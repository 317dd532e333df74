# Canonical JSON in C, shared by the compiler (Parameters) and evolve (results).

# Writes the decimal digits of v at w (room for 20 + sign); returns how many.
cdef Py_ssize_t put_int(char* w, long long v) noexcept

# canonical_dumps(d) (an ASCII str) for a flat object of plain scalars; None otherwise.
cdef object flat_canonical(dict d)
