/* fr_client.c - RPC client library (in progress). */
