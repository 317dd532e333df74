# The recipe compiler: a checked recipe object in, the graph's bytes out.

# The blob of a recipe (a parsed JSON object) of schema minor 0 or 1; RecipeError
# listing every problem.
cdef bytes build_graph(object obj, int minor)
