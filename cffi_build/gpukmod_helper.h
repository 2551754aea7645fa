/* The gpukmod C helper: thin, errno-returning wrappers the Python client calls via cffi.
 * Every function returns 0 (or a non-negative count) or a negative errno. None prints,
 * exits or keeps state between calls: the caller owns every fd and buffer. */
int gk_nl_open(int unit, int rcvbuf, int *fd_out, unsigned int *portid_out);
int gk_nl_send(int fd, const void *buf, size_t len);
int gk_nl_recv(int fd, void *buf, size_t cap, int timeout_ms);
int gk_nl_close(int fd);
int gk_module_load(const char *path, const char *params);
int gk_module_unload(const char *name);
int gk_module_version(const char *name, char *buf, size_t cap);
