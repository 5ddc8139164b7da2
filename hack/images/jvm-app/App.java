// The JVM test application: knows nothing about Lumigo. Same paths as the other test apps (see
// hack/images/python-app/app.py): /healthz, / and /call?url=URL, on $PORT (default 8080).
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.lang.management.ManagementFactory;
import java.net.HttpURLConnection;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;

public final class App {
    private static final String[] ENV_KEYS = {
        "LD_PRELOAD", "PYTHONPATH", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "OTEL_SERVICE_NAME"
    };

    public static void main(String[] args) throws IOException {
        int port = Integer.parseInt(System.getenv().getOrDefault("PORT", "8080"));
        HttpServer server = HttpServer.create(new InetSocketAddress(port), 64);
        server.createContext("/healthz", exchange -> reply(exchange, 200, "text/plain", "ok\n"));
        server.createContext("/call", App::call);
        server.createContext("/", App::describe);
        server.start();
        System.out.println("listening on " + port);
    }

    private static void describe(HttpExchange exchange) throws IOException {
        boolean traced = ManagementFactory.getRuntimeMXBean().getInputArguments().stream()
                .anyMatch(arg -> arg.startsWith("-javaagent:"));
        StringBuilder env = new StringBuilder();
        for (String key : ENV_KEYS) {
            String value = System.getenv(key);
            env.append(env.length() == 0 ? "" : ",").append(quote(key)).append(':')
                    .append(value == null ? "null" : quote(value));
        }
        String body = "{\"app\":\"jvm\",\"runtime\":" + quote("java " + Runtime.version())
                + ",\"traced\":" + traced + ",\"env\":{" + env + "},\"token_set\":"
                + (System.getenv("LUMIGO_TRACER_TOKEN") != null) + "}";
        reply(exchange, 200, "application/json", body);
    }

    private static void call(HttpExchange exchange) throws IOException {
        String query = exchange.getRequestURI().getRawQuery();
        String url = query != null && query.startsWith("url=")
                ? URLDecoder.decode(query.substring(4), StandardCharsets.UTF_8) : "";
        try {
            HttpURLConnection connection = (HttpURLConnection) URI.create(url).toURL().openConnection();
            connection.setConnectTimeout(10_000);
            connection.setReadTimeout(10_000);
            int status = connection.getResponseCode();
            String text;
            try (InputStream in = status < 400 ? connection.getInputStream() : connection.getErrorStream()) {
                text = in == null ? "" : new String(in.readNBytes(200), StandardCharsets.UTF_8);
            }
            reply(exchange, 200, "application/json", "{\"url\":" + quote(url) + ",\"status\":" + status
                    + ",\"body\":" + quote(text) + "}");
        } catch (IOException | IllegalArgumentException e) {
            reply(exchange, 502, "application/json",
                    "{\"url\":" + quote(url) + ",\"error\":" + quote(String.valueOf(e)) + "}");
        }
    }

    private static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                out.append('\\').append(c);
            } else if (c < 0x20) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }

    private static void reply(HttpExchange exchange, int status, String type, String body)
            throws IOException {
        byte[] bytes = body.getBytes(StandardCharsets.UTF_8);
        exchange.getResponseHeaders().set("Content-Type", type);
        exchange.sendResponseHeaders(status, bytes.length);
        try (OutputStream out = exchange.getResponseBody()) {
            out.write(bytes);
        }
    }
}
