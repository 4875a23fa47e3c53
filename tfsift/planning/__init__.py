"""From a Keras model to stage bounds: graph tracing, profiling, placement, the plan."""
