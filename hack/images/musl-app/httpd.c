/* The musl test application: a tiny HTTP/1.0 server with the same paths as the other test apps
 * (see hack/images/python-app/app.py): /healthz, / and /call?url=http://HOST[:PORT]/PATH, on $PORT
 * (default 8080). One connection at a time; enough for probes and a few test requests.
 * Built twice with musl-gcc: dynamically linked (httpd) and static (httpd-static, -DSTATIC). */
#define _GNU_SOURCE
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#ifdef STATIC
#define LINKAGE "static"
#else
#define LINKAGE "dynamic"
#endif

static const char *const ENV_KEYS[] = {"LD_PRELOAD", "PYTHONPATH", "NODE_OPTIONS",
                                       "JAVA_TOOL_OPTIONS", "OTEL_SERVICE_NAME"};

static void stop(int sig) { (void)sig; _exit(0); }

/* Appends s to out as a JSON string (quotes included); returns the new length. */
static size_t json_string(char *out, size_t len, size_t cap, const char *s) {
    len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "\"");
    for (; *s && len + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') len += (size_t)snprintf(out + len, cap - len, "\\%c", c);
        else if (c < 0x20) len += (size_t)snprintf(out + len, cap - len, "\\u%04x", c);
        else out[len++] = (char)c;
    }
    len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "\"");
    return len < cap ? len : cap - 1;
}

static void reply(int fd, int status, const char *type, const char *body) {
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, status == 200 ? "OK" : "Error", type, strlen(body));
    if (write(fd, head, (size_t)n) < 0 || write(fd, body, strlen(body)) < 0) return;
}

static void describe(int fd) {
    char body[4096];
    size_t len = (size_t)snprintf(body, sizeof body,
                                  "{\"app\":\"musl-c\",\"runtime\":\"musl " LINKAGE
                                  "\",\"traced\":false,\"env\":{");
    for (size_t i = 0; i < sizeof ENV_KEYS / sizeof *ENV_KEYS; i++) {
        const char *value = getenv(ENV_KEYS[i]);
        len = json_string(body, len, sizeof body, ENV_KEYS[i]);
        len += (size_t)snprintf(body + len, sizeof body - len, ":");
        if (value) len = json_string(body, len, sizeof body, value);
        else len += (size_t)snprintf(body + len, sizeof body - len, "null");
        len += (size_t)snprintf(body + len, sizeof body - len, i + 1 < 5 ? "," : "");
    }
    snprintf(body + len, sizeof body - len, "},\"token_set\":%s}\n",
             getenv("LUMIGO_TRACER_TOKEN") ? "true" : "false");
    reply(fd, 200, "application/json", body);
}

static void url_decode(char *s) {
    char *out = s;
    for (; *s; s++) {
        unsigned int c;
        if (*s == '%' && sscanf(s + 1, "%2x", &c) == 1) { *out++ = (char)c; s += 2; }
        else *out++ = *s == '+' ? ' ' : *s;
    }
    *out = 0;
}

/* GET url (http:// only); writes the status and the first bytes of the body as JSON. */
static void call(int fd, char *url) {
    char body[1024], response[1024] = "", host[256], port[8] = "80", *path;
    url_decode(url);
    char *start = strncmp(url, "http://", 7) == 0 ? url + 7 : NULL;
    size_t len = (size_t)snprintf(body, sizeof body, "{\"url\":");
    len = json_string(body, len, sizeof body, url);
    if (!start) {
        snprintf(body + len, sizeof body - len, ",\"error\":\"only http:// URLs\"}\n");
        reply(fd, 400, "application/json", body);
        return;
    }
    path = strchr(start, '/');
    size_t host_len = path ? (size_t)(path - start) : strlen(start);
    snprintf(host, sizeof host, "%.*s", (int)host_len, start);
    char *colon = strchr(host, ':');
    if (colon) { *colon = 0; snprintf(port, sizeof port, "%s", colon + 1); }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *found = NULL;
    int rc = getaddrinfo(host, port, &hints, &found), sock = -1;
    if (rc == 0) {
        sock = socket(found->ai_family, SOCK_STREAM, 0);
        struct timeval timeout = {.tv_sec = 10};
        setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
        setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
        if (connect(sock, found->ai_addr, found->ai_addrlen) != 0) { close(sock); sock = -1; }
        freeaddrinfo(found);
    }
    if (sock < 0) {
        len += (size_t)snprintf(body + len, sizeof body - len, ",\"error\":");
        len = json_string(body, len, sizeof body, rc ? gai_strerror(rc) : "connect failed");
        snprintf(body + len, sizeof body - len, "}\n");
        reply(fd, 502, "application/json", body);
        return;
    }
    char request[512];
    int n = snprintf(request, sizeof request, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n",
                     path ? path : "/", host);
    size_t got = 0;
    ssize_t r = write(sock, request, (size_t)n);
    while (r >= 0 && got + 1 < sizeof response &&
           (r = read(sock, response + got, sizeof response - 1 - got)) > 0)
        got += (size_t)r;
    close(sock);
    response[got] = 0;
    int status = 0;
    sscanf(response, "HTTP/%*s %d", &status);
    char *text = strstr(response, "\r\n\r\n");
    len += (size_t)snprintf(body + len, sizeof body - len, ",\"status\":%d,\"body\":", status);
    len = json_string(body, len, sizeof body, text ? text + 4 : "");
    snprintf(body + len, sizeof body - len, "}\n");
    reply(fd, 200, "application/json", body);
}

int main(void) {
    signal(SIGTERM, stop); /* PID 1 in a container: the default action would be ignored */
    signal(SIGINT, stop);
    signal(SIGPIPE, SIG_IGN);
    const char *port = getenv("PORT");
    int server = socket(AF_INET, SOCK_STREAM, 0), on = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET,
                               .sin_port = htons((unsigned short)atoi(port ? port : "8080")),
                               .sin_addr.s_addr = htonl(INADDR_ANY)};
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (bind(server, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(server, 64) != 0) {
        perror("httpd: listen");
        return 1;
    }
    printf("listening on %s (musl, %s)\n", port ? port : "8080", LINKAGE);
    fflush(stdout);
    for (;;) {
        int fd = accept(server, NULL, NULL);
        if (fd < 0) continue;
        struct timeval timeout = {.tv_sec = 5};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
        char request[2048];
        ssize_t n = read(fd, request, sizeof request - 1);
        request[n > 0 ? n : 0] = 0;
        char path[1024] = "";
        sscanf(request, "GET %1023s", path);
        if (strcmp(path, "/healthz") == 0) reply(fd, 200, "text/plain", "ok\n");
        else if (strncmp(path, "/call?url=", 10) == 0) call(fd, path + 10);
        else if (path[0] == '/') describe(fd);
        else reply(fd, 400, "text/plain", "bad request\n");
        close(fd);
    }
}
