"""Graph-level building blocks shared by the loaders, transformations and export."""
