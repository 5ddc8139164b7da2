// A -javaagent of the application's own, as an APM agent or a profiler would be: the injector
// must leave a JVM that has one alone (tests set JAVA_TOOL_OPTIONS=-javaagent:/app/own-agent.jar).
public final class OwnAgent {
    private OwnAgent() {}

    public static void premain(String args) {
        System.out.println("own agent loaded");
    }
}
