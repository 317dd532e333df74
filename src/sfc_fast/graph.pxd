# The compiled recipe graph: struct of arrays over one immutable bytes blob.
#
# Node ids: steps are 0 .. n_steps-1, branches n_steps .. n_steps+n_branches-1.
# Every table is an int32 (or int64 for times) array pointing into the blob; the
# blob is what to_bytes() returns and what from_bytes() validates
# (the layout: _layout.pxd).

from libc.stdint cimport int32_t, int64_t

from sfc_fast.conditions cimport CondContext

# Action qualifiers.
cdef enum:
    Q_N = 0
    Q_P = 1
    Q_P1 = 2
    Q_P0 = 3
    Q_S = 4
    Q_R = 5
    Q_L = 6
    Q_D = 7

# Interactions.
cdef enum:
    I_PUSH = 0
    I_PULL = 1

# Branch types.
cdef enum:
    B_SELECTION = 0
    B_SIMULTANEOUS = 1

# Transition kinds.
cdef enum:
    TK_STEP = 0          # from a step outside any branch path
    TK_ENTRY = 1         # branch -> first step of one of its paths
    TK_EXIT = 2          # branch -> after the branch converged
    TK_PATH = 3          # between steps of one path (explicit)
    TK_IMPLICIT = 4      # next step of a path, or a selection path with no entry condition
    TK_PATH_END = 5      # from a path step to its own branch: this path has ended

# Step flags.
cdef enum:
    SF_INITIAL = 1

cdef class Graph:
    cdef readonly bytes _blob
    cdef readonly int n_steps
    cdef readonly int n_branches
    cdef readonly int n_paths
    cdef readonly int n_path_steps
    cdef readonly int n_transitions
    cdef readonly int n_actions
    cdef readonly int n_conds
    cdef readonly int n_code
    cdef readonly int n_refs
    cdef readonly int n_ref_segs
    cdef readonly int n_consts
    cdef readonly int n_strings
    cdef readonly int schema_minor        # 0 = v1.0.0, 1 = v1.1.0
    cdef readonly int initial_step

    # steps
    cdef const int32_t* step_name
    cdef const int32_t* step_flags
    cdef const int32_t* step_path         # path index or -1
    cdef const int32_t* step_act_off      # CSR [n_steps+1] into step_acts
    cdef const int32_t* step_acts         # association indices, document order
    # nodes (steps then branches)
    cdef const int32_t* node_out_off      # CSR [n_nodes+1] into node_out
    cdef const int32_t* node_out          # transition indices by priority, then order
    # transitions
    cdef const int32_t* tr_source
    cdef const int32_t* tr_target
    cdef const int32_t* tr_priority
    cdef const int32_t* tr_cond           # condition index, -1 = always true
    cdef const int32_t* tr_kind
    cdef const int32_t* tr_text           # string id of the source text, -1 if implicit
    # actions (associations, reset associations included)
    cdef const int32_t* act_name
    cdef const int32_t* act_step
    cdef const int32_t* act_qual
    cdef const int32_t* act_inter
    cdef const int32_t* act_type
    cdef const int32_t* act_params        # string id of canonical JSON, -1 = none
    cdef const int32_t* act_hold_type     # -1 = none
    cdef const int32_t* act_restart_type  # -1 = none
    cdef const int32_t* act_retries
    cdef const int32_t* act_match_subject # string id of a template, -1 = none
    cdef const int32_t* act_match_corr    # string id of a template, -1 = none
    cdef const int32_t* act_reset         # for R: the S association it resets; else -1
    cdef const int64_t* act_timeout_ms
    cdef const int64_t* act_hold_timeout_ms
    cdef const int64_t* act_duration_ms   # D: delay, L: limit; 0 = none
    # branches
    cdef const int32_t* br_name
    cdef const int32_t* br_type
    cdef const int32_t* br_path_off       # CSR [n_branches+1] into paths
    # paths
    cdef const int32_t* path_branch
    cdef const int32_t* path_off          # CSR [n_paths+1] into path_steps
    cdef const int32_t* path_steps
    # conditions
    cdef const int32_t* cond_off          # [n_conds+1] into code
    cdef const int32_t* code
    cdef const int32_t* ref_kind
    cdef const int32_t* ref_action
    cdef const int32_t* ref_seg_off       # [n_refs+1] into ref_segs
    cdef const int32_t* ref_segs          # string ids
    cdef const int32_t* const_text        # string id of each constant's JSON text
    # strings
    cdef const int32_t* str_off           # [n_strings+1] into str_data
    cdef const char* str_data

    # lazily decoded Python views
    cdef list _strs
    cdef list _consts
    cdef list _refs
    cdef list _params
    cdef dict _step_index
    cdef dict _action_index
    cdef dict _branch_index
    cdef object _scratch           # evolve's reusable working set (one call at a time)
    cdef bytes _pins               # state.pyx's pins of actions and steps (made lazily)

    cdef str s(self, int32_t sid)
    cdef list consts(self)
    cdef list refs(self)
    cdef object params(self, int a)
    cdef dict action_names(self)
    cdef object eval_cond(self, int cond, CondContext ctx)


# The Graph over blob, which is checked first (GraphFormatError).
cdef Graph graph_of(bytes blob)
