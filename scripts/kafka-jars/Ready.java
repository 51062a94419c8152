// Exits 0 once the broker at args[0] answers a metadata request (DescribeCluster) and reports
// at least one broker; exits 1 when args[1] seconds pass without that. scripts/kafka runs it
// with the broker's own jars on the class path, so readiness means "a client can talk to it",
// not merely "the port is open".
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeClusterOptions;

public class Ready {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[1]));
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "2000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "3000");
        props.put(AdminClientConfig.RECONNECT_BACKOFF_MAX_MS_CONFIG, "200");
        String last = "no answer";
        try (Admin admin = Admin.create(props)) {
            while (System.nanoTime() < deadline) {
                try {
                    int brokers = admin.describeCluster(new DescribeClusterOptions().timeoutMs(3000))
                        .nodes().get(4, TimeUnit.SECONDS).size();
                    if (brokers > 0) {
                        System.out.println("ready: " + brokers + " broker(s) at " + bootstrap);
                        return;
                    }
                    last = "cluster has no brokers yet";
                } catch (Exception e) {
                    last = e.getMessage();
                }
                Thread.sleep(200);
            }
        }
        System.err.println("broker at " + bootstrap + " did not answer a metadata request: " + last);
        System.exit(1);
    }
}
