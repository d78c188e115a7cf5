"""Layer 3, what a tap is: stage plans, TapSets and their sidecars, the sink every engine writes into, and the
engine toolkits (torch hooks, MLX shadows, the JAX layer library) a family writes its taps and emitter with."""
