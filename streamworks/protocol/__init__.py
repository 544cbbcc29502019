"""Wire formats shared by the data plane, the coordinator and its clients."""
