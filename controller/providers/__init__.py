"""Fleet adapters: one module per provider, one small interface (`base.Provider`)."""
