"""Wire formats shared by the data plane, the coordinator and its clients, and the one
seam between them: the API's endpoints (``api``), the transport Protocol
(``transport``) and its two implementations (``client`` over HTTP, ``local``
in-process). Imports neither the coordinator nor the runtime."""
