"""Engine adapters: one module per engine, each importing its engine lazily."""
