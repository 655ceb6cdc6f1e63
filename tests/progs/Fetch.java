/* Run by tests/test_e2e_everyday.py. */
import java.io.*;
import java.net.*;
import java.nio.charset.StandardCharsets;

public class Fetch {
    public static void main(String[] args) throws Exception {
        // HTTP(S) URLs: http(s).proxyHost
        for (String url : new String[] {"http://api.github.com/whoami", "https://api.github.com/whoami"}) {
            HttpURLConnection c = (HttpURLConnection) new URL(url).openConnection();
            try (InputStream in = c.getInputStream()) {
                System.out.println(new String(in.readAllBytes(), StandardCharsets.UTF_8).trim());
            }
        }
        // A plain socket: socksProxyHost, the name resolved by the door
        try (Socket s = new Socket("pypi.world", 80)) {
            s.getOutputStream().write("GET /whoami HTTP/1.0\r\nHost: pypi.world\r\n\r\n".getBytes(StandardCharsets.US_ASCII));
            String reply = new String(s.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            System.out.println(reply.substring(reply.indexOf("\r\n\r\n") + 4).trim());
        }
    }
}
